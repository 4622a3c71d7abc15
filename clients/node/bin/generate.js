#!/usr/bin/env node
// Submit one request to fairq and print one JSON line per event on stdout:
//   {"type":"started","backend_id":"sim-0",...}
//   {"type":"chunk","text":"..."}
// On a gRPC error, prints {"error":{"code":"INVALID_ARGUMENT","details":"..."}}
// and exits 1. Usage errors go to stderr with exit code 2.

import { parseArgs } from 'node:util';

import { createClient, FairqError } from '../src/client.js';

const USAGE = `usage: generate.js --model NAME --prompt TEXT [options]
  --target HOST:PORT   fairq server (default 127.0.0.1:50051)
  --api-key KEY        API key (default: $FAIRQ_API_KEY)
  --user NAME          user, for servers without API keys
  --max-tokens N  --temperature T  --top-p P  --seed N  --stop S (repeatable)
  --ignore-eos  --tier NAME  --request-id ID  --timeout SECONDS
  --extra JSON         backend parameters passed through, a JSON object`;

function usageError(message) {
  process.stderr.write(`generate.js: ${message}\n${USAGE}\n`);
  process.exit(2);
}

function parseNumber(name, text, { integer = false } = {}) {
  if (text === undefined) return undefined;
  const value = Number(text);
  if (text.trim() === '' || !Number.isFinite(value) || (integer && !Number.isInteger(value))) {
    usageError(`--${name} must be ${integer ? 'an integer' : 'a number'}, got '${text}'`);
  }
  return value;
}

let args;
try {
  ({ values: args } = parseArgs({
    options: {
      target: { type: 'string', default: '127.0.0.1:50051' },
      'api-key': { type: 'string' },
      user: { type: 'string' },
      model: { type: 'string' },
      prompt: { type: 'string' },
      'max-tokens': { type: 'string' },
      temperature: { type: 'string' },
      'top-p': { type: 'string' },
      seed: { type: 'string' },
      stop: { type: 'string', multiple: true, default: [] },
      'ignore-eos': { type: 'boolean', default: false },
      tier: { type: 'string', default: '' },
      'request-id': { type: 'string', default: '' },
      timeout: { type: 'string' },
      extra: { type: 'string' },
      help: { type: 'boolean', short: 'h', default: false },
    },
  }));
} catch (err) {
  usageError(err.message);
}
if (args.help) {
  process.stdout.write(`${USAGE}\n`);
  process.exit(0);
}
if (args.model === undefined) usageError('--model is required');
if (args.prompt === undefined) usageError('--prompt is required');

const request = {
  model: args.model,
  prompt: args.prompt,
  max_tokens: parseNumber('max-tokens', args['max-tokens'], { integer: true }),
  temperature: parseNumber('temperature', args.temperature),
  top_p: parseNumber('top-p', args['top-p']),
  seed: parseNumber('seed', args.seed, { integer: true }),
  stop: args.stop,
  ignore_eos: args['ignore-eos'],
  tier: args.tier,
  request_id: args['request-id'],
};
if (args.extra !== undefined) {
  try {
    request.extra = JSON.parse(args.extra);
  } catch (err) {
    usageError(`--extra must be a JSON object: ${err.message}`);
  }
  if (request.extra === null || typeof request.extra !== 'object' || Array.isArray(request.extra)) {
    usageError('--extra must be a JSON object');
  }
}
const timeoutSeconds = parseNumber('timeout', args.timeout);

const client = createClient(args.target, {
  // From the environment by default: a key on the command line shows in `ps`.
  apiKey: args['api-key'] ?? process.env.FAIRQ_API_KEY,
  user: args.user,
});

// Ctrl-C cancels the request on the server instead of leaving it queued.
const abort = new AbortController();
process.once('SIGINT', () => abort.abort());

try {
  const events = client.generate(request, {
    signal: abort.signal,
    timeoutMs: timeoutSeconds === undefined ? undefined : timeoutSeconds * 1000,
  });
  for await (const event of events) {
    process.stdout.write(`${JSON.stringify(event)}\n`);
  }
} catch (err) {
  if (err instanceof FairqError) {
    process.stdout.write(
      `${JSON.stringify({ error: { code: err.codeName, details: err.details } })}\n`,
    );
    process.exitCode = 1;
  } else if (abort.signal.aborted) {
    process.exitCode = 130;
  } else {
    throw err;
  }
} finally {
  client.close();
}
