//! cpu_ratio (Rust): burns CPU in `burn_a` and `burn_b` in a 3:1 ratio of
//! thread CPU time, on the main thread and on one helper thread named
//! `rs-helper`, for a wall-clock duration, and reports what it measured.
//!
//! usage: cpu_ratio SECONDS [--wait-stdin]
//!
//! At exit it prints one line to stdout:
//!   pid=P cpu_ns=N a_ns=A b_ns=B main_tid=T helper_tid=H
//! cpu_ns is the process's user+system time (getrusage RUSAGE_SELF), a_ns and
//! b_ns the thread CPU time spent inside `burn_a` and `burn_b` summed over
//! both threads (CLOCK_THREAD_CPUTIME_ID).
//!
//! Build: rustc -O -C force-frame-pointers=yes -g cpu_ratio.rs (std only).

use std::hint::black_box;
use std::io::Read;
use std::time::{Duration, Instant};

// A 3.6 ms cycle, no multiple of the tests' sampling periods (see
// cpu_ratio.c).
const SLICE_A_NS: u64 = 2_700_000;
const SLICE_B_NS: u64 = 900_000;
const CHUNK: u32 = 40_000;

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

#[repr(C)]
struct Timeval {
    tv_sec: i64,
    tv_usec: i64,
}

#[repr(C)]
struct Rusage {
    ru_utime: Timeval,
    ru_stime: Timeval,
    rest: [i64; 14],
}

const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
const RUSAGE_SELF: i32 = 0;
const SYS_GETTID: i64 = 186;

unsafe extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    fn getrusage(who: i32, usage: *mut Rusage) -> i32;
    fn syscall(number: i64, ...) -> i64;
}

fn thread_cpu_ns() -> u64 {
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; the clock id is a constant Linux defines.
    unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn process_cpu_ns() -> u64 {
    // SAFETY: all-zero is a valid Rusage.
    let mut ru: Rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer of the kernel's struct rusage layout.
    unsafe { getrusage(RUSAGE_SELF, &mut ru) };
    (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) as u64 * 1_000_000_000
        + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) as u64 * 1_000
}

fn gettid() -> u64 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { syscall(SYS_GETTID) as u64 }
}

// The arithmetic is written out in each burner so that the sampled
// instruction pointer is inside that burner.
macro_rules! spin {
    ($x:ident) => {
        for _ in 0..CHUNK {
            $x = black_box(
                $x.wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407),
            );
        }
    };
}

/// Burns until this thread has used `slice_ns` of CPU; returns the CPU used.
#[inline(never)]
fn burn_a(slice_ns: u64, seed: u64) -> (u64, u64) {
    let mut x = seed;
    let start = thread_cpu_ns();
    loop {
        spin!(x);
        let now = thread_cpu_ns();
        if now - start >= slice_ns {
            return (now - start, x);
        }
    }
}

#[inline(never)]
fn burn_b(slice_ns: u64, seed: u64) -> (u64, u64) {
    let mut x = seed;
    let start = thread_cpu_ns();
    loop {
        spin!(x);
        let now = thread_cpu_ns();
        if now - start >= slice_ns {
            return (now - start, x);
        }
    }
}

/// Alternates the burners until `deadline`; returns (a_ns, b_ns).
#[inline(never)]
fn run_workload(deadline: Instant) -> (u64, u64, u64) {
    let (mut a_ns, mut b_ns, mut x) = (0, 0, 1);
    while Instant::now() < deadline {
        let (a, xa) = burn_a(SLICE_A_NS, x);
        let (b, xb) = burn_b(SLICE_B_NS, xa);
        a_ns += a;
        b_ns += b;
        x = xb;
    }
    (a_ns, b_ns, x)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(seconds) = args.get(1).and_then(|s| s.parse::<f64>().ok()) else {
        eprintln!("usage: cpu_ratio SECONDS [--wait-stdin]");
        std::process::exit(2);
    };
    if args[2..].iter().any(|a| a == "--wait-stdin") {
        let mut byte = [0u8; 1];
        let _ = std::io::stdin().read(&mut byte);
    }
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let helper = std::thread::Builder::new()
        .name("rs-helper".to_string())
        .spawn(move || {
            let tid = gettid();
            let (a, b, x) = run_workload(deadline);
            (tid, a, b, x)
        })
        .expect("spawning the helper thread");
    let (a_main, b_main, x) = run_workload(deadline);
    let (helper_tid, a_helper, b_helper, y) = helper.join().expect("helper thread panicked");
    black_box((x, y));
    println!(
        "pid={} cpu_ns={} a_ns={} b_ns={} main_tid={} helper_tid={}",
        std::process::id(),
        process_cpu_ns(),
        a_main + a_helper,
        b_main + b_helper,
        gettid(),
        helper_tid
    );
}
