// Copies the repository's protos into this package (protos/), so the package
// carries what it loads and works outside a checkout once packed. Runs on
// `npm ci` / `npm install` in the checkout (prepare), before `npm test` and
// before `npm pack`. Installed from a tarball, the copy is already inside.

import { cpSync, existsSync, rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const source = fileURLToPath(new URL('../../../protos/fairq', import.meta.url));
const target = fileURLToPath(new URL('../protos/fairq', import.meta.url));

if (existsSync(source)) {
  rmSync(target, { recursive: true, force: true });
  cpSync(source, target, { recursive: true });
} else if (!existsSync(target)) {
  console.error(`copy-protos: neither ${source} nor ${target} exists`);
  process.exit(1);
}
