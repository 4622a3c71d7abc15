// fairq.v1 Scheduler messages from and to the plain objects the client passes:
// a flat generate request -> GenerateRequest (with `extra` as a google.protobuf.Struct),
// a GenerateResponse -> an event tagged by `type` (see client.js for the shapes).
// Nothing here talks to the network; client.js does.

// A JSON object as a google.protobuf.Struct message. protobufjs bundles struct.proto
// with camelCase field names (numberValue, ...), whatever keepCase says.
function toStruct(object, path) {
  if (object === null || typeof object !== 'object' || Array.isArray(object)) {
    throw new TypeError(`${path} must be a plain object`);
  }
  const fields = {};
  for (const [key, value] of Object.entries(object)) {
    fields[key] = toValue(value, `${path}.${key}`);
  }
  return { fields };
}

function toValue(value, path) {
  if (value === null) return { nullValue: 'NULL_VALUE' };
  switch (typeof value) {
    case 'number':
      if (!Number.isFinite(value)) throw new TypeError(`${path} is not a finite number`);
      return { numberValue: value };
    case 'string':
      return { stringValue: value };
    case 'boolean':
      return { boolValue: value };
    case 'object':
      if (Array.isArray(value)) {
        return { listValue: { values: value.map((v, i) => toValue(v, `${path}[${i}]`)) } };
      }
      return { structValue: toStruct(value, path) };
    default:
      throw new TypeError(`${path} is a ${typeof value}, which is not a JSON value`);
  }
}

// A decoded google.protobuf.Struct as a plain object.
function fromStruct(struct) {
  return Object.fromEntries(
    Object.entries(struct.fields ?? {}).map(([key, value]) => [key, fromValue(value)]),
  );
}

function fromValue(value) {
  switch (value.kind) {
    case 'numberValue':
      return value.numberValue;
    case 'stringValue':
      return value.stringValue;
    case 'boolValue':
      return value.boolValue;
    case 'structValue':
      return fromStruct(value.structValue);
    case 'listValue':
      return (value.listValue.values ?? []).map(fromValue);
    default:
      return null;
  }
}

const REQUEST_FIELDS = new Set([
  'model',
  'prompt',
  'messages',
  'max_tokens',
  'temperature',
  'top_p',
  'stop',
  'seed',
  'ignore_eos',
  'tier',
  'request_id',
  'extra',
]);
const OPTIONAL_SAMPLING = ['max_tokens', 'temperature', 'top_p', 'seed'];

// Builds a fairq.v1.GenerateRequest from the flat request the caller passes.
// Checks only what the message cannot express; limits are the server's.
export function toGenerateRequest(request) {
  for (const key of Object.keys(request)) {
    // protobufjs drops unknown keys silently, so `maxTokens: 8` would
    // otherwise be sent as "no limit".
    if (!REQUEST_FIELDS.has(key)) {
      throw new TypeError(
        `unknown request field '${key}'; fields are snake_case as in the proto: ` +
          [...REQUEST_FIELDS].join(', '),
      );
    }
  }
  const { model, prompt, messages, stop = [], ignore_eos = false } = request;
  if ((prompt === undefined) === (messages === undefined)) {
    throw new TypeError('pass exactly one of prompt or messages');
  }
  if (typeof stop === 'string') {
    throw new TypeError('stop must be an array of strings, not a string');
  }
  const sampling = { stop, ignore_eos };
  // Unset optional fields mean "the backend's default": send only those given.
  for (const key of OPTIONAL_SAMPLING) {
    if (request[key] !== undefined && request[key] !== null) sampling[key] = request[key];
  }
  const message = {
    model,
    sampling,
    tier: request.tier ?? '',
    request_id: request.request_id ?? '',
  };
  if (request.extra !== undefined && request.extra !== null) {
    message.extra = toStruct(request.extra, 'extra');
  }
  if (prompt !== undefined) {
    message.prompt = prompt;
  } else {
    message.messages = { messages: messages.map(toChatMessage) };
  }
  return message;
}

function toChatMessage(m) {
  if (Array.isArray(m)) {
    const [role, content] = m;
    return { role, content };
  }
  return { role: m.role, content: m.content };
}

export function eventFromResponse(response) {
  switch (response.event) {
    case 'queued':
      return { type: 'queued', position: response.queued.position };
    case 'started': {
      const { backend_id, queue_seconds, tier, request_id } = response.started;
      return { type: 'started', backend_id, queue_seconds, tier, request_id };
    }
    case 'chunk': {
      const { text, extra } = response.chunk;
      return extra ? { type: 'chunk', text, extra: fromStruct(extra) } : { type: 'chunk', text };
    }
    case 'finished': {
      const { finish_reason, usage, timings } = response.finished;
      return {
        type: 'finished',
        finish_reason,
        prompt_tokens: usage?.prompt_tokens ?? 0,
        completion_tokens: usage?.completion_tokens ?? 0,
        queue_seconds: timings?.queue_seconds ?? 0,
        ttft_seconds: timings?.ttft_seconds ?? 0,
        total_seconds: timings?.total_seconds ?? 0,
      };
    }
    default:
      // An event kind added by a newer server: skip it rather than fail.
      return null;
  }
}
