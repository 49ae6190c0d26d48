//! unwind_nofp (Rust): burns CPU in `work_a` and `work_b`, both called from
//! `run`, called from `main`, in a 3:1 ratio of calls, for a wall-clock
//! duration. Meant to be built as an optimized release build WITHOUT
//! `-C force-frame-pointers`, so that only .eh_frame unwinding finds the
//! callers of the leaf functions.
//!
//! usage: unwind_nofp SECONDS [--wait-stdin]
//!
//! At exit it prints one line to stdout:
//!   pid=P
//!
//! Build: rustc --edition 2024 --crate-name unwind_nofp_rs -C opt-level=3 -g
//! unwind_nofp.rs (std only).

use std::hint::black_box;
use std::io::Read;
use std::time::{Duration, Instant};

const STEPS: usize = 20_000;

/// Multiply-add steps through a scratch array on the stack, so that the
/// frame is not empty.
#[inline(never)]
fn work_a(seed: u64) -> u64 {
    let mut scratch = [0u64; 32];
    let mut x = seed;
    for i in 0..STEPS {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        scratch[i & 31] = black_box(x);
    }
    x ^ black_box(&scratch)[(seed & 31) as usize]
}

#[inline(never)]
fn work_b(seed: u64) -> u64 {
    let mut scratch = [0u64; 16];
    let mut x = seed;
    for i in 0..STEPS {
        x = x.wrapping_mul(2862933555777941757).wrapping_add(3037000493);
        scratch[i & 15] = black_box(x);
    }
    x ^ black_box(&scratch)[(seed & 15) as usize]
}

/// Calls `work_a` three times for each call of `work_b` until `deadline`.
#[inline(never)]
fn run(deadline: Instant) -> u64 {
    let mut x = 1;
    while Instant::now() < deadline {
        x = work_a(x);
        x = work_a(x);
        x = work_a(x);
        x = work_b(x);
    }
    x
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(seconds) = args.get(1).and_then(|s| s.parse::<f64>().ok()) else {
        eprintln!("usage: unwind_nofp SECONDS [--wait-stdin]");
        std::process::exit(2);
    };
    if args[2..].iter().any(|a| a == "--wait-stdin") {
        let mut byte = [0u8; 1];
        let _ = std::io::stdin().read(&mut byte);
    }
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    black_box(run(deadline));
    println!("pid={}", std::process::id());
}
