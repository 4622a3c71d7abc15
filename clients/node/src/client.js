// fairq client for Node.js, built at run time from the .proto files shipped in
// this package (protos/, copied from the repository's protos/ by scripts/copy-protos.js).
//
// Field names stay exactly as in the .proto files (snake_case: max_tokens,
// backend_id, completion_tokens, ...), in requests and in events alike, so they
// read the same here, in the Python client and in the proto docs.
//
//   import { createClient } from '@fairq/client';
//   const client = createClient('127.0.0.1:50051', { user: 'bob' });
//   for await (const event of client.generate({ model: 'm', prompt: 'hi', max_tokens: 8 })) {
//     if (event.type === 'chunk') process.stdout.write(event.text);
//   }
//   client.close();
//
// Events are plain objects tagged by `type`:
//   { type: 'queued', position }
//   { type: 'started', backend_id, queue_seconds, tier, request_id }
//   { type: 'chunk', text }             (and `extra`, a plain object, when the
//                                         backend sent more than text: tool calls, logprobs)
//   { type: 'finished', finish_reason, prompt_tokens, completion_tokens,
//     queue_seconds, ttft_seconds, total_seconds }
// A gRPC failure is thrown as a FairqError carrying the status code and details;
// `retryable` is true for UNAVAILABLE and RESOURCE_EXHAUSTED (see the Python
// client's fairq._errors for why), with the server's `retryAfterMs` if it sent one.
//
// Backend kinds are read from the proto's BackendKind enum (BACKEND_KINDS), and
// pass-through parameters (GenerateRequest.extra) are given as a plain object.

import { fileURLToPath } from 'node:url';

import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';

import { eventFromResponse, toGenerateRequest } from './messages.js';

const PROTO_ROOT = fileURLToPath(new URL('../protos', import.meta.url));

const packageDefinition = protoLoader.loadSync(
  ['fairq/v1/scheduler.proto', 'fairq/v1/admin.proto'],
  {
    includeDirs: [PROTO_ROOT],
    keepCase: true,
    longs: Number,
    enums: String,
    // Decoded messages carry zero values for unset scalars, as in proto3, so
    // a `queued` event at position 0 still has `position: 0`.
    defaults: true,
    // Adds a virtual field naming the member of each oneof that is set.
    oneofs: true,
  },
);
const fairqV1 = grpc.loadPackageDefinition(packageDefinition).fairq.v1;

const KIND_PREFIX = 'BACKEND_KIND_';
// Our kind name ('openai') -> the enum's value name, from the loaded proto.
const KIND_VALUES = Object.fromEntries(
  packageDefinition['fairq.v1.BackendKind'].type.value
    .filter(({ number }) => number !== 0)
    .map(({ name }) => [name.slice(KIND_PREFIX.length).toLowerCase(), name]),
);
const KIND_NAMES = Object.fromEntries(Object.entries(KIND_VALUES).map(([k, v]) => [v, k]));

/** The backend kinds fairq drives, as named in the proto's BackendKind enum: 'vllm', 'tgi', ... */
export const BACKEND_KINDS = Object.freeze(Object.keys(KIND_VALUES));

// Every fairq.v1.Backend field, from the loaded proto.
const BACKEND_FIELDS = packageDefinition['fairq.v1.Backend'].type.field.map((f) => f.name);

const STATUS_NAMES = Object.fromEntries(
  Object.entries(grpc.status).map(([name, code]) => [code, name]),
);

/** A fairq call failed with a gRPC status. */
export class FairqError extends Error {
  /**
   * @param {number} code gRPC status code, e.g. 3 (grpc.status.INVALID_ARGUMENT).
   * @param {string} details the server's human-readable message.
   * @param {{cause?: unknown}} [options]
   */
  constructor(code, details, options) {
    const codeName = STATUS_NAMES[code] ?? 'UNKNOWN';
    super(`${codeName}: ${details}`, options);
    this.name = 'FairqError';
    this.code = code;
    /** The status code's name, e.g. 'INVALID_ARGUMENT'. */
    this.codeName = codeName;
    this.details = details;
    /** The same request may succeed if sent again later. */
    this.retryable = RETRYABLE.has(code);
    /** Milliseconds the server asked to wait before retrying (grpc-retry-pushback-ms), or null. */
    this.retryAfterMs = null;
  }
}

const RETRYABLE = new Set([grpc.status.UNAVAILABLE, grpc.status.RESOURCE_EXHAUSTED]);

function toFairqError(err) {
  if (err && typeof err.code === 'number') {
    const error = new FairqError(err.code, err.details ?? '', { cause: err });
    const [pushback] = err.metadata?.get('grpc-retry-pushback-ms') ?? [];
    if (error.retryable && /^[0-9]+$/.test(String(pushback))) {
      error.retryAfterMs = Number(pushback);
    }
    return error;
  }
  return err;
}

// Builds a fairq.v1.Backend from {id, kind, base_url, models, ...}: any Backend field
// of the proto, named as there.
function toBackend(backend) {
  for (const key of Object.keys(backend)) {
    if (!BACKEND_FIELDS.includes(key)) {
      throw new TypeError(`unknown backend field '${key}'; fields: ${BACKEND_FIELDS.join(', ')}`);
    }
  }
  if (!(backend.kind in KIND_VALUES)) {
    throw new TypeError(`unknown backend kind '${backend.kind}'; valid: ${BACKEND_KINDS.join(', ')}`);
  }
  if (!Array.isArray(backend.models)) {
    throw new TypeError('models must be an array of model names');
  }
  return { ...backend, kind: KIND_VALUES[backend.kind] };
}

function snapshotFromProto(response) {
  return {
    taken_at_unix_seconds: response.taken_at_unix_seconds,
    models: response.models.map((m) => ({
      model: m.model,
      queued: m.queued,
      tiers: m.tiers.map((t) => ({ tier: t.tier, queued: t.queued })),
      queued_users: m.queued_users,
    })),
    users: response.users.map((u) => ({
      user: u.user,
      queued: u.queued,
      recent_tokens: u.recent_tokens,
    })),
    backends: response.backends.map((b) => ({
      status: backendStatusFromProto(b.status ?? {}),
      gates: b.gates.map((g) => ({ tier: g.tier, state: g.state })),
    })),
    known_users: response.known_users,
  };
}

function backendStatusFromProto(status) {
  const b = status.backend ?? {};
  const backend = Object.fromEntries(BACKEND_FIELDS.map((name) => [name, b[name]]));
  return {
    backend: { ...backend, kind: KIND_NAMES[b.kind] ?? 'unspecified', models: b.models ?? [] },
    healthy: status.healthy,
    in_flight: status.in_flight,
    waiting: status.waiting,
    running: status.running,
    tpot_seconds: status.tpot_seconds,
    draining: status.draining,
    reason: status.reason,
  };
}

const SOURCE_NAMES = { ENTRY_SOURCE_FILE: 'file', ENTRY_SOURCE_STORE: 'store' };
const LIMIT_KINDS = { quota: 'LIMIT_KIND_QUOTA', budget: 'LIMIT_KIND_BUDGET' };
const LIMIT_AMOUNTS = [
  'tokens_per_minute', 'tokens_per_day', 'requests_per_minute', 'per_day', 'per_month',
];

function teamFromProto(team) {
  return { name: team.name, weight: team.weight, source: SOURCE_NAMES[team.source] ?? '' };
}

function limitFromProto(limit) {
  const amounts = Object.fromEntries(LIMIT_AMOUNTS.map((name) => [name, limit[name]]));
  return {
    kind: limit.kind === 'LIMIT_KIND_QUOTA' ? 'quota' : 'budget',
    team: limit.team, user: limit.user, model: limit.model, ...amounts,
    mode: limit.mode, source: SOURCE_NAMES[limit.source] ?? '',
  };
}

function limitKind(kind) {
  if (!(kind in LIMIT_KINDS)) throw new TypeError(`kind must be 'quota' or 'budget', not ${kind}`);
  return LIMIT_KINDS[kind];
}

function callOptions(timeoutMs) {
  return timeoutMs === undefined ? {} : { deadline: Date.now() + timeoutMs };
}

/**
 * Create a fairq client.
 *
 * @param {string} target server address, e.g. '127.0.0.1:50051'.
 * @param {object} [options]
 * @param {string} [options.apiKey] sent as `authorization: Bearer <apiKey>`.
 * @param {string} [options.user] sent as `x-fairq-user` (servers without API keys).
 * @param {grpc.ChannelCredentials} [options.credentials] TLS; insecure if omitted.
 */
export function createClient(target, { apiKey, user, credentials } = {}) {
  const creds = credentials ?? grpc.credentials.createInsecure();
  const scheduler = new fairqV1.Scheduler(target, creds);
  // One channel for both services.
  const admin = new fairqV1.Admin(target, creds, { channelOverride: scheduler.getChannel() });

  function metadata() {
    const md = new grpc.Metadata();
    if (apiKey !== undefined && apiKey !== null) md.set('authorization', `Bearer ${apiKey}`);
    if (user !== undefined && user !== null) md.set('x-fairq-user', user);
    return md;
  }

  async function* stream(message, { signal, timeoutMs }) {
    signal?.throwIfAborted();
    const call = scheduler.Generate(message, metadata(), callOptions(timeoutMs));
    const onAbort = () => call.cancel();
    signal?.addEventListener('abort', onAbort, { once: true });
    try {
      for await (const response of call) {
        const event = eventFromResponse(response);
        if (event !== null) yield event;
      }
    } catch (err) {
      // Cancelling one's own request is not a gRPC failure to report.
      if (signal?.aborted) throw signal.reason;
      throw toFairqError(err);
    } finally {
      signal?.removeEventListener('abort', onAbort);
      // A no-op once the stream has ended. If the consumer left early (break,
      // return, throw), this tells the server to release the request's slot.
      // cancel() emits a CANCELLED 'error' that no one is left to read, and an
      // unhandled 'error' event would crash the process.
      call.on('error', () => {});
      call.cancel();
    }
  }

  function unary(method, request, { timeoutMs } = {}) {
    return new Promise((resolve, reject) => {
      admin[method](request, metadata(), callOptions(timeoutMs), (err, response) =>
        err ? reject(toFairqError(err)) : resolve(response),
      );
    });
  }

  return {
    /**
     * Submit one request and stream its lifecycle events.
     *
     * Throws TypeError at once for a malformed request; the call itself starts
     * when iteration starts. Leaving the loop early cancels the call.
     *
     * @param {object} request {model, prompt | messages, max_tokens, temperature,
     *   top_p, stop, seed, ignore_eos, tier, request_id, extra}; messages are
     *   {role, content} objects or [role, content] pairs; extra is a plain
     *   object of backend parameters passed through (tools, response_format, ...).
     * @param {{signal?: AbortSignal, timeoutMs?: number}} [options]
     * @returns {AsyncGenerator<object>} events, see the top of this file.
     */
    generate(request, options = {}) {
      return stream(toGenerateRequest(request), options);
    },

    /**
     * Report every registered backend and its live state (admin only).
     *
     * @param {{timeoutMs?: number}} [options]
     * @returns {Promise<object[]>} BackendStatus objects, field names as in the proto.
     */
    async listBackends(options = {}) {
      const response = await unary('ListBackends', {}, options);
      return response.backends.map(backendStatusFromProto);
    },

    /**
     * Register a backend, or replace the one with the same id (admin only).
     *
     * @param {object} backend fairq.v1.Backend fields as named in the proto: {id,
     *   kind (one of BACKEND_KINDS), base_url, models, priority_scheduling,
     *   max_in_flight, preempt, metrics_preset, ...}.
     * @param {{timeoutMs?: number}} [options]
     * @returns {Promise<object>} the backend's BackendStatus right after registration.
     */
    async registerBackend(backend, options = {}) {
      const request = { backend: toBackend(backend) };
      const response = await unary('RegisterBackend', request, options);
      return backendStatusFromProto(response.status ?? {});
    },

    /**
     * Remove a backend (admin only). With `drain`, resolves once its in-flight
     * requests have finished.
     *
     * @param {string} id
     * @param {{drain?: boolean, timeoutMs?: number}} [options]
     * @returns {Promise<void>}
     */
    async deregisterBackend(id, { drain = false, ...options } = {}) {
      await unary('DeregisterBackend', { id, drain }, options);
    },

    /**
     * Queue depth per model and tier, top users and backend gates (admin only).
     *
     * @param {{topUsers?: number, timeoutMs?: number}} [options]
     * @returns {Promise<object>} field names as in the proto's GetQueueSnapshotResponse.
     */
    async queueSnapshot({ topUsers = 0, ...options } = {}) {
      const response = await unary('GetQueueSnapshot', { top_users: topUsers }, options);
      return snapshotFromProto(response);
    },

    /**
     * Set a team's weight on every replica sharing fairq's store; it overrides
     * the configuration file's team of that name (admin only).
     *
     * @param {string} name
     * @param {number} weight above 0.
     * @param {{timeoutMs?: number}} [options]
     * @returns {Promise<object>} {name, weight, source}.
     */
    async setTeam(name, weight, options = {}) {
      const response = await unary('SetTeam', { team: { name, weight } }, options);
      return teamFromProto(response.team ?? {});
    },

    /** Remove a stored team weight; the file's applies again (admin only). */
    async deleteTeam(name, options = {}) {
      await unary('DeleteTeam', { name }, options);
    },

    /** @returns {Promise<object[]>} the teams in force: {name, weight, source}. */
    async listTeams(options = {}) {
      const response = await unary('ListTeams', {}, options);
      return response.teams.map(teamFromProto);
    },

    /**
     * Set a quota or a budget on every replica; it overrides the file's entry of
     * the same subject (admin only). Bad input rejects with INVALID_ARGUMENT
     * naming the field.
     *
     * @param {object} limit {kind: 'quota'|'budget', team | user, model,
     *   tokens_per_minute, tokens_per_day, requests_per_minute, per_day,
     *   per_month, mode: 'hard'|'soft'}.
     * @param {{timeoutMs?: number}} [options]
     * @returns {Promise<object>} the entry stored, with its source.
     */
    async setLimit(limit, options = {}) {
      const message = { ...limit, kind: limitKind(limit.kind) };
      const response = await unary('SetLimit', { limit: message }, options);
      return limitFromProto(response.limit ?? {});
    },

    /**
     * Remove a stored quota or budget; the file's applies again (admin only).
     *
     * @param {'quota'|'budget'} kind
     * @param {{team?: string, user?: string, model?: string, timeoutMs?: number}} [subject]
     */
    async deleteLimit(kind, { team = '', user = '', model = '', ...options } = {}) {
      await unary('DeleteLimit', { kind: limitKind(kind), team, user, model }, options);
    },

    /** @returns {Promise<object[]>} the quotas and budgets in force. */
    async listLimits(options = {}) {
      const response = await unary('ListLimits', {}, options);
      return response.limits.map(limitFromProto);
    },

    /**
     * The changes admins made, newest first (admin only).
     *
     * @param {{limit?: number, action?: string, timeoutMs?: number}} [options]
     * @returns {Promise<object[]>} {at_unix_seconds, actor, via, action, target,
     *   detail, replica}.
     */
    async auditLog({ limit = 0, action = '', ...options } = {}) {
      const response = await unary('ListAuditLog', { limit, action }, options);
      return response.entries;
    },

    /** Close the channel; calls still running are cancelled. */
    close() {
      scheduler.close();
    },
  };
}
