// The Node client and CLI against a fake fairq Scheduler/Admin served by
// grpc-js on 127.0.0.1:0 in this process.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { after, before, beforeEach, describe, it } from 'node:test';
import { promisify } from 'node:util';

import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';

import { BACKEND_KINDS, createClient, FairqError } from '../src/client.js';

const PROTO_ROOT = fileURLToPath(new URL('../../../protos', import.meta.url));
const CLI = fileURLToPath(new URL('../bin/generate.js', import.meta.url));

// A decoded fairq.v1.Backend: every field, unset ones at their zero value.
const BACKEND_DEFAULTS = {
  id: '',
  kind: 'unspecified',
  base_url: '',
  models: [],
  priority_scheduling: false,
  max_in_flight: 0,
  metrics_preset: '',
  waiting_metric: '',
  running_metric: '',
  kv_usage_metric: '',
  tpot_metric: '',
  priority_order: '',
  api_key_env: '',
  fair_share_priority: false,
  preempt: false,
};

const fairqV1 = grpc.loadPackageDefinition(
  protoLoader.loadSync(['fairq/v1/scheduler.proto', 'fairq/v1/admin.proto'], {
    includeDirs: [PROTO_ROOT],
    keepCase: true,
  }),
).fairq.v1;

const SCRIPT = [
  { queued: { position: 1 } },
  { queued: { position: 0 } },
  {
    started: { backend_id: 'vllm-a', queue_seconds: 0.25, tier: 'interactive', request_id: 'r-1' },
  },
  { chunk: { text: 'Hel' } },
  { chunk: { text: 'lo' } },
  {
    finished: {
      finish_reason: 'length',
      usage: { prompt_tokens: 3, completion_tokens: 2 },
      timings: { queue_seconds: 0.25, ttft_seconds: 0.5, total_seconds: 0.75 },
    },
  },
];

const EVENTS = [
  { type: 'queued', position: 1 },
  { type: 'queued', position: 0 },
  {
    type: 'started',
    backend_id: 'vllm-a',
    queue_seconds: 0.25,
    tier: 'interactive',
    request_id: 'r-1',
  },
  { type: 'chunk', text: 'Hel' },
  { type: 'chunk', text: 'lo' },
  {
    type: 'finished',
    finish_reason: 'length',
    prompt_tokens: 3,
    completion_tokens: 2,
    queue_seconds: 0.25,
    ttft_seconds: 0.5,
    total_seconds: 0.75,
  },
];

// What the fake does on the next Generate, and what it saw.
const fake = {
  script: SCRIPT,
  error: null, // {code, details} to end the stream with
  holdOpen: false,
  requests: [],
  metadata: [],
  cancelled: null, // resolves when a held-open stream is cancelled
  reset() {
    Object.assign(this, { script: SCRIPT, error: null, holdOpen: false });
    Object.assign(this, { requests: [], metadata: [] });
    this.cancelled = new Promise((resolve) => {
      this.onCancelled = resolve;
    });
  },
};

const server = new grpc.Server();
server.addService(fairqV1.Scheduler.service, {
  Generate(call) {
    fake.requests.push(call.request);
    fake.metadata.push(call.metadata.getMap());
    call.on('cancelled', () => fake.onCancelled());
    for (const response of fake.script) call.write(response);
    if (fake.error) {
      call.emit('error', fake.error);
    } else if (!fake.holdOpen) {
      call.end();
    }
  },
});
server.addService(fairqV1.Admin.service, {
  ListBackends(call, callback) {
    fake.metadata.push(call.metadata.getMap());
    callback(null, {
      backends: [
        {
          backend: { id: 'tgi-a', kind: 'BACKEND_KIND_TGI', base_url: 'http://x', models: ['m'] },
          healthy: true,
          in_flight: 2,
        },
      ],
    });
  },
  RegisterBackend(call, callback) {
    fake.requests.push(call.request);
    callback(null, { status: { backend: call.request.backend, healthy: true } });
  },
  DeregisterBackend(call, callback) {
    fake.requests.push(call.request);
    if (call.request.id === 'nope') {
      callback({ code: grpc.status.NOT_FOUND, details: "no backend 'nope'" });
    } else {
      callback(null, {});
    }
  },
  GetQueueSnapshot(call, callback) {
    fake.requests.push(call.request);
    callback(null, {
      taken_at_unix_seconds: 1800000000.5,
      models: [
        {
          model: 'm',
          queued: 3,
          tiers: [
            { tier: 'interactive', queued: 1 },
            { tier: 'batch', queued: 2 },
          ],
          queued_users: 2,
        },
      ],
      users: [{ user: 'bob', queued: 2, recent_tokens: 12.5 }],
      backends: [
        {
          status: { backend: { id: 'vllm-a', kind: 'BACKEND_KIND_VLLM' }, in_flight: 4 },
          gates: [
            { tier: 'interactive', state: 'admit' },
            { tier: 'batch', state: 'waiting' },
          ],
        },
      ],
      known_users: 5,
    });
  },
});

let target;
let client;

before(async () => {
  const port = await new Promise((resolve, reject) =>
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, p) =>
      err ? reject(err) : resolve(p),
    ),
  );
  target = `127.0.0.1:${port}`;
  client = createClient(target, { apiKey: 'k-1', user: 'bob' });
});

after(() => {
  client.close();
  server.forceShutdown();
});

beforeEach(() => fake.reset());

async function collect(iterable) {
  const events = [];
  for await (const event of iterable) events.push(event);
  return events;
}

describe('generate', () => {
  it('streams typed events and sends request fields and identity metadata', async () => {
    const sent = { model: 'm', prompt: 'hi', max_tokens: 8, tier: 'batch' };
    const events = await collect(client.generate(sent));
    assert.deepEqual(events, EVENTS);
    const [request] = fake.requests;
    assert.equal(request.model, 'm');
    assert.equal(request.prompt, 'hi');
    assert.equal(request.tier, 'batch');
    assert.equal(request.sampling.max_tokens, 8);
    // Unset optional sampling fields stay unset (the backend's default).
    assert.equal(request.sampling.temperature, undefined);
    assert.equal(fake.metadata[0].authorization, 'Bearer k-1');
    assert.equal(fake.metadata[0]['x-fairq-user'], 'bob');
  });

  it('sends chat messages given as objects or pairs', async () => {
    const messages = [['system', 'be brief'], { role: 'user', content: 'hi' }];
    await collect(client.generate({ model: 'm', messages }));
    assert.deepEqual(fake.requests[0].messages.messages, [
      { role: 'system', content: 'be brief' },
      { role: 'user', content: 'hi' },
    ]);
  });

  it('skips event kinds it does not know', async () => {
    fake.script = [{}, ...SCRIPT];
    assert.deepEqual(await collect(client.generate({ model: 'm', prompt: 'hi' })), EVENTS);
  });

  it('maps a gRPC error to FairqError after the events sent before it', async () => {
    fake.script = SCRIPT.slice(0, 2);
    fake.error = { code: grpc.status.INVALID_ARGUMENT, details: 'max_tokens must be > 0' };
    const seen = [];
    await assert.rejects(
      async () => {
        for await (const event of client.generate({ model: 'm', prompt: 'hi' })) seen.push(event);
      },
      (err) => {
        assert.ok(err instanceof FairqError);
        assert.equal(err.code, grpc.status.INVALID_ARGUMENT);
        assert.equal(err.codeName, 'INVALID_ARGUMENT');
        assert.equal(err.details, 'max_tokens must be > 0');
        return true;
      },
    );
    assert.deepEqual(seen, EVENTS.slice(0, 2));
  });

  // Without cancellation these would wait forever: fail them in time instead.
  const CANCEL_PATIENCE = { timeout: 5000 };

  it('cancels the server stream when the loop is left early', CANCEL_PATIENCE, async () => {
    fake.holdOpen = true;
    for await (const event of client.generate({ model: 'm', prompt: 'hi' })) {
      if (event.type === 'chunk') break;
    }
    await fake.cancelled;
  });

  it('cancels the server stream on abort, throwing the reason', CANCEL_PATIENCE, async () => {
    fake.holdOpen = true;
    const controller = new AbortController();
    const events = client.generate({ model: 'm', prompt: 'hi' }, { signal: controller.signal });
    await assert.rejects(async () => {
      for await (const event of events) {
        if (event.type === 'finished') controller.abort();
      }
    }, { name: 'AbortError' });
    await fake.cancelled;
  });

  it('passes extra through as a Struct and returns chunk extras as objects', async () => {
    const tools = [{ type: 'function', function: { name: 'emit', parameters: {} } }];
    const extra = { tools, top_k: 5, logprobs: true, note: null };
    fake.script = [
      ...SCRIPT.slice(0, 3),
      {
        chunk: {
          text: '',
          extra: {
            fields: {
              choices: {
                listValue: {
                  values: [{ structValue: { fields: { index: { numberValue: 0 } } } }],
                },
              },
            },
          },
        },
      },
      SCRIPT.at(-1),
    ];
    const events = await collect(client.generate({ model: 'm', prompt: 'hi', extra }));
    assert.deepEqual(events[3], { type: 'chunk', text: '', extra: { choices: [{ index: 0 }] } });
    const sent = fake.requests[0].extra.fields;
    assert.equal(sent.top_k.numberValue, 5);
    assert.equal(sent.logprobs.boolValue, true);
    assert.equal(sent.note.nullValue, 0); // NULL_VALUE (the fake decodes enums as numbers)
    const tool = sent.tools.listValue.values[0].structValue.fields;
    assert.equal(tool.function.structValue.fields.name.stringValue, 'emit');
  });

  it('marks retryable errors with the server retry delay', async () => {
    fake.script = [];
    const trailers = new grpc.Metadata();
    trailers.set('grpc-retry-pushback-ms', '1500');
    fake.error = { code: grpc.status.RESOURCE_EXHAUSTED, details: 'queue full', metadata: trailers };
    await assert.rejects(collect(client.generate({ model: 'm', prompt: 'hi' })), (err) => {
      assert.equal(err.retryable, true);
      assert.equal(err.retryAfterMs, 1500);
      return true;
    });
    fake.error = { code: grpc.status.DEADLINE_EXCEEDED, details: 'queued too long' };
    await assert.rejects(collect(client.generate({ model: 'm', prompt: 'hi' })), (err) => {
      assert.equal(err.retryable, false);
      assert.equal(err.retryAfterMs, null);
      return true;
    });
  });

  it('rejects malformed requests before any call', () => {
    assert.throws(() => client.generate({ model: 'm' }), /exactly one of prompt or messages/);
    assert.throws(
      () => client.generate({ model: 'm', prompt: 'hi', maxTokens: 8 }),
      /unknown request field 'maxTokens'/,
    );
    assert.throws(
      () => client.generate({ model: 'm', prompt: 'hi', stop: '\n' }),
      /stop must be an array/,
    );
    assert.throws(
      () => client.generate({ model: 'm', prompt: 'hi', extra: { f: () => 1 } }),
      /extra.f is a function/,
    );
    assert.throws(() => client.generate({ model: 'm', prompt: 'hi', extra: [1] }), /plain object/);
    assert.equal(fake.requests.length, 0);
  });
});

describe('listBackends', () => {
  it('returns backend statuses with proto field names', async () => {
    const [status] = await client.listBackends();
    assert.deepEqual(status.backend, {
      ...BACKEND_DEFAULTS,
      id: 'tgi-a',
      kind: 'tgi',
      base_url: 'http://x',
      models: ['m'],
    });
    assert.equal(status.healthy, true);
    assert.equal(status.in_flight, 2);
    assert.equal(fake.metadata[0].authorization, 'Bearer k-1');
  });

  it('maps errors', async () => {
    const unreachable = createClient('127.0.0.1:1');
    try {
      await assert.rejects(unreachable.listBackends({ timeoutMs: 5000 }), (err) => {
        assert.ok(err instanceof FairqError);
        assert.equal(err.codeName, 'UNAVAILABLE');
        return true;
      });
    } finally {
      unreachable.close();
    }
  });
});

describe('backend management and the queue snapshot', () => {
  it('registers a backend with proto field names and kind names', async () => {
    const status = await client.registerBackend({
      id: 'vllm-b',
      kind: 'vllm',
      base_url: 'http://127.0.0.1:8001',
      models: ['m'],
      max_in_flight: 8,
    });
    assert.equal(fake.requests[0].backend.kind, 1); // BACKEND_KIND_VLLM on the wire
    assert.equal(fake.requests[0].backend.max_in_flight, 8);
    assert.deepEqual(status.backend, {
      ...BACKEND_DEFAULTS,
      id: 'vllm-b',
      kind: 'vllm',
      base_url: 'http://127.0.0.1:8001',
      models: ['m'],
      max_in_flight: 8,
    });
    assert.equal(status.healthy, true);
  });

  it('registers the openai kind with its metric settings', async () => {
    const status = await client.registerBackend({
      id: 'sglang-a',
      kind: 'openai',
      base_url: 'http://127.0.0.1:30000',
      models: ['m'],
      metrics_preset: 'sglang',
    });
    assert.equal(fake.requests[0].backend.kind, 3); // BACKEND_KIND_OPENAI on the wire
    assert.equal(fake.requests[0].backend.metrics_preset, 'sglang');
    assert.equal(status.backend.kind, 'openai');
    assert.equal(status.backend.metrics_preset, 'sglang');
  });

  it('registers a backend that allows preemption', async () => {
    const status = await client.registerBackend({
      id: 'vllm-p',
      kind: 'vllm',
      base_url: 'http://127.0.0.1:8002',
      models: ['m'],
      max_in_flight: 4,
      preempt: true,
    });
    assert.equal(fake.requests[0].backend.preempt, true);
    assert.equal(status.backend.preempt, true);
  });

  it('names the kinds as the proto does', () => {
    assert.deepEqual(BACKEND_KINDS, ['vllm', 'tgi', 'openai']);
  });

  it('rejects a malformed backend before any call', async () => {
    await assert.rejects(client.registerBackend({ id: 'x', kind: 'sglang', models: [] }), TypeError);
    await assert.rejects(client.registerBackend({ id: 'x', kind: 'tgi', models: 'm' }), TypeError);
    await assert.rejects(
      client.registerBackend({ id: 'x', kind: 'tgi', models: [], maxInFlight: 2 }),
      /unknown backend field 'maxInFlight'/,
    );
    assert.equal(fake.requests.length, 0);
  });

  it('deregisters with drain and maps NOT_FOUND', async () => {
    await client.deregisterBackend('vllm-b', { drain: true });
    assert.deepEqual(fake.requests[0], { id: 'vllm-b', drain: true });
    await assert.rejects(client.deregisterBackend('nope'), (err) => err.codeName === 'NOT_FOUND');
  });

  it('returns the queue snapshot with proto field names', async () => {
    const snap = await client.queueSnapshot({ topUsers: 3 });
    assert.equal(fake.requests[0].top_users, 3);
    assert.equal(snap.taken_at_unix_seconds, 1800000000.5);
    assert.deepEqual(snap.models[0].tiers, [
      { tier: 'interactive', queued: 1 },
      { tier: 'batch', queued: 2 },
    ]);
    assert.deepEqual(snap.users, [{ user: 'bob', queued: 2, recent_tokens: 12.5 }]);
    assert.equal(snap.backends[0].status.backend.kind, 'vllm');
    assert.equal(snap.backends[0].status.in_flight, 4);
    assert.deepEqual(snap.backends[0].gates[1], { tier: 'batch', state: 'waiting' });
    assert.equal(snap.known_users, 5);
  });
});

describe('bin/generate.js', () => {
  // Asynchronous on purpose: a synchronous spawn would block this process's
  // event loop, and with it the fake server the CLI talks to.
  const run = promisify(execFile);

  it('prints one JSON line per event', async () => {
    const { stdout } = await run(process.execPath, [
      CLI,
      ...['--target', target, '--user', 'bob', '--model', 'm', '--prompt', 'hello'],
      ...['--max-tokens', '8'],
    ]);
    const lines = stdout.trim().split('\n').map((line) => JSON.parse(line));
    assert.deepEqual(lines, EVENTS);
    assert.equal(fake.requests[0].sampling.max_tokens, 8);
    assert.equal(fake.metadata[0]['x-fairq-user'], 'bob');
  });

  it('prints the error and exits non-zero on a gRPC error', async () => {
    fake.script = [];
    fake.error = { code: grpc.status.NOT_FOUND, details: "unknown model 'm'" };
    const args = [CLI, '--target', target, '--model', 'm', '--prompt', 'hi'];
    const failure = await run(process.execPath, args).then(
      () => assert.fail('the CLI should have failed'),
      (err) => err,
    );
    assert.equal(failure.code, 1);
    assert.deepEqual(JSON.parse(failure.stdout.trim()), {
      error: { code: 'NOT_FOUND', details: "unknown model 'm'" },
    });
  });

  it('passes --extra through', async () => {
    const args = [CLI, '--target', target, '--model', 'm', '--prompt', 'hi'];
    await run(process.execPath, [...args, '--extra', '{"top_k": 5}']);
    assert.equal(fake.requests[0].extra.fields.top_k.numberValue, 5);
    const failure = await run(process.execPath, [...args, '--extra', '[1]']).then(
      () => assert.fail('the CLI should have failed'),
      (err) => err,
    );
    assert.equal(failure.code, 2);
    assert.match(failure.stderr, /--extra must be a JSON object/);
  });

  it('exits 2 on a usage error', async () => {
    const failure = await run(process.execPath, [CLI, '--prompt', 'hi']).then(
      () => assert.fail('the CLI should have failed'),
      (err) => err,
    );
    assert.equal(failure.code, 2);
    assert.match(failure.stderr, /--model is required/);
  });
});
