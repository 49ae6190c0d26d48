#!/bin/sh
# busy_node.sh: the load of a node that runs real software, for the
# footprint benchmark and the memory-limit test. Runs every program below
# that the machine has (large binaries and libraries: compilers, language
# runtimes, emulators, debuggers, most of them busy for a moment), two at a
# time, over and over, until killed (run it in its own process group).
#
# usage: busy_node.sh   (prints "programs N" once, to stderr)

set -u
progs=0
step() {
    # step PROGRAM ARGS...: start it in the background if present.
    command -v "$1" >/dev/null 2>&1 || return 0
    progs=$((progs + 1))
    timeout 5 "$@" </dev/null >/dev/null 2>&1 &
    if [ $((progs % 2)) -eq 0 ]; then
        wait
    fi
}

round() {
    progs=0
    step python3 -c 'import json; json.dumps(list(range(200000)))'
    step perl -e 'my $s = 0; $s += $_ for 1..500000'
    step node -e 'let s = 0; for (let i = 0; i < 3e6; i++) s += i'
    step java -version
    step go version
    step rustc --version --verbose
    step cargo --version
    step qemu-system-x86_64 --version
    step bpftrace --version
    step perf version
    step gdb --version
    step sqlite3 :memory: 'select count(*) from generate_series(1, 300000);'
    step git --version
    step openssl speed -seconds 1 sha256
    step objdump -d /usr/bin/make
    step readelf -a /usr/bin/perl
    step xz -9 -c /usr/bin/perl
    step zstd -19 -c /usr/bin/perl
    step bzip2 -c /usr/bin/make
    step tar -cf - /usr/include/linux
    step busybox sha256sum /usr/bin/perl
    wait
}

round
echo "programs $progs" >&2
while :; do
    round
done
