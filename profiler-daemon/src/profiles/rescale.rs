//! Go's rules for turning sampled events into estimates of all events
//! (runtime/mprof.go, runtime/pprof), in one place for every profile type.

/// Heap: a stack with `count` sampled allocations totalling `bytes`, sampled
/// with mean `rate` bytes between samples (Poisson sampling), stands for
/// `count * scale` allocations and `bytes * scale` bytes, where
/// `scale = 1 / (1 - exp(-(bytes / count) / rate))` is the inverse of the
/// chance that an allocation of the average size was sampled.
pub fn heap_scale(count: u64, bytes: u64, rate: u64) -> f64 {
    if count == 0 || rate <= 1 {
        return 1.0;
    }
    let average = bytes as f64 / count as f64;
    let p = 1.0 - (-average / rate as f64).exp();
    if p <= 0.0 { 1.0 } else { 1.0 / p }
}

/// Block and off-CPU: what one kept event of duration `duration_ns` adds,
/// as (events, nanoseconds). An event shorter than the rate was kept with
/// probability duration/rate, so it stands for rate/duration events and
/// `rate` nanoseconds; a longer one was always kept and counts as itself.
pub fn block_event(duration_ns: u64, rate_ns: u64) -> (f64, f64) {
    if rate_ns > 0 && duration_ns < rate_ns {
        let events = rate_ns as f64 / duration_ns.max(1) as f64;
        (events, rate_ns as f64)
    } else {
        (1.0, duration_ns as f64)
    }
}

/// Whether an event is kept: decided in the kernel, by the rule in
/// `profiler_common::sampling`.
#[cfg(test)]
pub use profiler_common::sampling::keep_block_event;

/// Mutex: one kept wake-up in `fraction` with a delay of `delay_ns` stands
/// for `fraction` contentions and `fraction * delay_ns` nanoseconds.
pub fn mutex_event(delay_ns: u64, fraction: u64) -> (f64, f64) {
    let n = fraction.max(1) as f64;
    (n, n * delay_ns as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_scale_follows_go() {
        // An allocation as large as the rate is sampled with p = 1 - 1/e.
        let s = heap_scale(1, 512 * 1024, 512 * 1024);
        assert!((s - 1.0 / (1.0 - (-1.0f64).exp())).abs() < 1e-12);
        // Small allocations are rarely sampled: each sample stands for many.
        let s = heap_scale(10, 160, 512 * 1024);
        assert!((s - 1.0 / (1.0 - (-16.0 / 524_288.0f64).exp())).abs() < 1e-6);
        assert!(s > 32_000.0);
        // Huge allocations are always sampled.
        assert!((heap_scale(1, 1 << 40, 512 * 1024) - 1.0).abs() < 1e-9);
        // Rate 1 records everything.
        assert_eq!(heap_scale(3, 48, 1), 1.0);
    }

    /// The Go block profiler's bias example: waits of 1, 2 and 3 ms in counts
    /// 3 : 1.5 : 1 block equally long in total; sampled at 2.5 ms and
    /// corrected, each site's expected delay is its true delay.
    #[test]
    fn block_sampling_is_unbiased() {
        let rate = 2_500_000u64;
        let sites = [
            (1_000_000u64, 3000u64),
            (2_000_000, 1500),
            (3_000_000, 1000),
        ];
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        for (d, n) in sites {
            let (mut events, mut delay) = (0.0, 0.0);
            for _ in 0..n {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                if keep_block_event(d, rate, (state >> 32) as u32) {
                    let (e, t) = block_event(d, rate);
                    events += e;
                    delay += t;
                }
            }
            let true_delay = (d * n) as f64;
            assert!(
                (delay / true_delay - 1.0).abs() < 0.1,
                "{d}: {delay} vs {true_delay}"
            );
            assert!(
                (events / n as f64 - 1.0).abs() < 0.1,
                "{d}: {events} events vs {n}"
            );
        }
    }

    #[test]
    fn mutex_scales_by_the_fraction() {
        assert_eq!(mutex_event(2_000, 100), (100.0, 200_000.0));
        assert_eq!(mutex_event(2_000, 0), (1.0, 2_000.0));
    }
}
