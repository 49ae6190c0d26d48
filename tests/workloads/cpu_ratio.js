// cpu_ratio.js: a Node program that splits its CPU time 3:1 between two
// JavaScript functions, each reached through a caller of its own, for
// profiles of JIT-compiled code named from the perf map that Node writes
// under --perf-basic-prof (/tmp/perf-PID.map).
//
// usage: node --perf-basic-prof cpu_ratio.js SECONDS [--wait-stdin]
//
// At exit it prints one line to stdout:
//
//	pid=P heavy_ns=A light_ns=B
//
// heavy_ns and light_ns: the time spent in each leaf's loop, timed by
// the program (process.hrtime.bigint around each call).
'use strict';

function spinHeavy(n) {
  let x = 0;
  for (let i = 0; i < n; i++) {
    x = (x * 1103515245 + 12345) % 2147483647;
  }
  return x;
}

function spinLight(n) {
  let x = 1;
  for (let i = 0; i < n; i++) {
    x = (x * 69069 + 1) % 2147483647;
  }
  return x;
}

function callHeavy(n) {
  return spinHeavy(n);
}

function callLight(n) {
  return spinLight(n);
}

function run(seconds) {
  const deadline = process.hrtime.bigint() + BigInt(Math.round(seconds * 1e9));
  let heavy = 0n;
  let light = 0n;
  let sink = 0;
  // Each round gives the heavy leaf three slices for the light one's one,
  // by time, so that the split holds whatever the JIT makes of the loops.
  const slice = 2_000_000n;
  while (process.hrtime.bigint() < deadline) {
    for (let k = 0; k < 3; k++) {
      const t0 = process.hrtime.bigint();
      while (process.hrtime.bigint() - t0 < slice) {
        sink ^= callHeavy(2000);
      }
      heavy += process.hrtime.bigint() - t0;
    }
    const t0 = process.hrtime.bigint();
    while (process.hrtime.bigint() - t0 < slice) {
      sink ^= callLight(2000);
    }
    light += process.hrtime.bigint() - t0;
  }
  return { heavy, light, sink };
}

function main() {
  const seconds = Number(process.argv[2]);
  if (!(seconds > 0)) {
    process.stderr.write('usage: node --perf-basic-prof cpu_ratio.js SECONDS [--wait-stdin]\n');
    process.exit(2);
  }
  let started = false;
  const start = () => {
    if (started) {
      return;
    }
    started = true;
    process.stdin.pause();
    const { heavy, light } = run(seconds);
    process.stdout.write(`pid=${process.pid} heavy_ns=${heavy} light_ns=${light}\n`);
  };
  if (process.argv[3] === '--wait-stdin') {
    process.stdout.write(`ready pid=${process.pid}\n`);
    process.stdin.once('data', start);
    process.stdin.once('end', start);
  } else {
    start();
  }
}

main();
