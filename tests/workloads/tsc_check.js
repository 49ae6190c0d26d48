// tsc_check.js: TypeScript's compiler (the npm package `typescript`, code
// nobody here wrote) type-checking its own declaration file, again and
// again, for a profile of a real package's JavaScript beside
// `node --cpu-prof`.
//
// usage: node tsc_check.js TYPESCRIPT_DIR SECONDS [--wait-stdin]
//
// With --wait-stdin it waits for a line on stdin before it loads the
// compiler, so that a profiler started meanwhile sees the whole program.
// Each round builds a new program (parse, bind, check) of the same file.
// At exit it prints one line to stdout:
//
//     pid=P rounds=N diagnostics=D
'use strict';

const fs = require('fs');
const path = require('path');

const [dir, secondsText, wait] = process.argv.slice(2);
const seconds = Number(secondsText);
if (!dir || !(seconds > 0)) {
  console.error('usage: tsc_check.js TYPESCRIPT_DIR SECONDS [--wait-stdin]');
  process.exit(2);
}
if (wait === '--wait-stdin') {
  const byte = Buffer.alloc(1);
  fs.readSync(0, byte, 0, 1, null);
}

const ts = require(dir);
const file = path.join(dir, 'lib', 'typescript.d.ts');
const options = {
  noEmit: true,
  strict: true,
  target: ts.ScriptTarget.ES2020,
  lib: ['lib.es2020.d.ts'],
  types: [],
};
const end = Date.now() + seconds * 1000;
let rounds = 0;
let diagnostics = 0;
while (Date.now() < end) {
  const program = ts.createProgram([file], options);
  diagnostics += ts.getPreEmitDiagnostics(program).length;
  rounds += 1;
}
console.log(`pid=${process.pid} rounds=${rounds} diagnostics=${diagnostics}`);
