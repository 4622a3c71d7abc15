// The packed @fairq/client, installed from its tarball into a scratch project,
// against a running fairq. Usage: node node_smoke.mjs TARGET SIM_URL, with
// FAIRQ_API_KEY an admin key. Run from the scratch project, outside the checkout.

import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

import { createClient, FairqError } from '@fairq/client';

const [target, simUrl] = process.argv.slice(2);
const client = createClient(target, { apiKey: process.env.FAIRQ_API_KEY });
try {
  const packaged = fileURLToPath(import.meta.resolve('@fairq/client'));
  assert.ok(!packaged.includes('/clients/node/'), `resolved from the checkout: ${packaged}`);
  assert.ok(existsSync(new URL('../protos/fairq/v1/admin.proto', `file://${packaged}`)));

  const status = await client.registerBackend({
    id: 'sim-b', kind: 'vllm', base_url: simUrl, models: ['sim'],
  });
  assert.equal(status.healthy, true);
  const ids = (await client.listBackends()).map((s) => s.backend.id).sort();
  assert.deepEqual(ids, ['sim-a', 'sim-b']);

  const events = [];
  for await (const event of client.generate({
    model: 'sim', prompt: 'Hello from the tarball', max_tokens: 6, ignore_eos: true,
  })) {
    events.push(event);
  }
  assert.deepEqual(events.map((e) => e.type).filter((t, i, a) => a.indexOf(t) === i),
    ['queued', 'started', 'chunk', 'finished']);
  assert.equal(events.at(-1).completion_tokens, 6);

  const snap = await client.queueSnapshot({ topUsers: 5 });
  assert.equal(snap.models[0].model, 'sim');
  assert.ok(snap.backends.some((b) => b.status.backend.id === 'sim-b'));

  await client.deregisterBackend('sim-b', { drain: true });
  assert.deepEqual((await client.listBackends()).map((s) => s.backend.id), ['sim-a']);
  await assert.rejects(client.deregisterBackend('sim-b'),
    (err) => err instanceof FairqError && err.codeName === 'NOT_FOUND');
  console.log(`@fairq/client from its tarball on Node ${process.version}: every call OK`);
} finally {
  client.close();
}
