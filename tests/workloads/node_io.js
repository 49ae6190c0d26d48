// node_io.js: a Node program whose JavaScript runs from libuv's I/O
// callbacks, under `uv__io_poll`, which keeps 1024 epoll events (12 KiB)
// in its frame: a client and a server in one process echo a byte over a
// local TCP connection, each turn computing in `work` and the client
// waiting 1 ms on a timer between turns (the main thread then blocks in
// epoll_pwait, inside that frame). Stacks sampled there reach `main`
// only from a copy longer than that frame.
//
// usage: node node_io.js SECONDS [--wait-stdin]
//
// At exit it prints one line to stdout:
//
//	pid=P work_ns=W turns=T
//
// work_ns: the time spent in `work`, timed by the program around each
// call; turns: the echoes.
'use strict';

const net = require('net');

let workNs = 0n;
let turns = 0;

function work(n) {
  const start = process.hrtime.bigint();
  let x = 0;
  for (let i = 0; i < n; i++) {
    x = (x * 1103515245 + 12345) % 2147483647;
  }
  workNs += process.hrtime.bigint() - start;
  return x;
}

function run(seconds) {
  const server = net.createServer((socket) => {
    socket.on('data', (data) => {
      work(200000);
      socket.write(data);
    });
  });
  server.listen(0, '127.0.0.1', () => {
    const client = net.connect(server.address().port, '127.0.0.1');
    const end = Date.now() + seconds * 1000;
    client.on('data', (data) => {
      turns++;
      work(200000);
      if (Date.now() >= end) {
        client.destroy();
        server.close();
        process.stdout.write(`pid=${process.pid} work_ns=${workNs} turns=${turns}\n`);
        return;
      }
      setTimeout(() => client.write(data), 1);
    });
    client.write('x');
  });
}

const seconds = Number(process.argv[2] || '4');
if (process.argv.includes('--wait-stdin')) {
  process.stdin.once('data', () => {
    process.stdin.pause();
    run(seconds);
  });
} else {
  run(seconds);
}
