//! Go's Poisson sampling of allocations (runtime/malloc.go, `nextSample` and
//! `fastexprand`), in integer arithmetic that the BPF verifier accepts: the
//! bytes to allocate before the next sample are drawn from an exponential
//! distribution with mean R (`--heap-sample-bytes`), so that every byte has
//! the same chance 1/R of being the one that triggers a sample.

/// Random bits used per draw, as in Go.
const RANDOM_BITS: u32 = 26;

/// log2(1 + i/32) in Q16 for i = 0..=32: the mantissa part of log2,
/// interpolated linearly between entries (error below 2e-4).
const LOG2_TABLE_Q16: [u32; 33] = [
    0, 2909, 5732, 8473, 11136, 13727, 16248, 18704, 21098, 23433, 25711, 27936, 30109, 32234,
    34312, 36346, 38336, 40286, 42196, 44068, 45904, 47705, 49472, 51207, 52911, 54584, 56229,
    57845, 59434, 60997, 62534, 64047, 65536,
];

/// ln(2) in Q16.
const LN2_Q16: u64 = 45426;

/// log2(x) in Q16 for 1 <= x < 2^32.
#[inline(always)]
fn log2_q16(x: u32) -> u32 {
    // The position of the top bit, by halving steps (no loop, no clz: both
    // are awkward for the verifier).
    let mut msb = 0u32;
    let mut v = x;
    if v >= 1 << 16 {
        v >>= 16;
        msb += 16;
    }
    if v >= 1 << 8 {
        v >>= 8;
        msb += 8;
    }
    if v >= 1 << 4 {
        v >>= 4;
        msb += 4;
    }
    if v >= 1 << 2 {
        v >>= 2;
        msb += 2;
    }
    if v >= 1 << 1 {
        msb += 1;
    }
    // The bits below the top one, as a fraction in Q16.
    let frac = ((u64::from(x) << 16) >> msb) as u32 & 0xffff;
    let index = (frac >> 11) as usize & 31; // 32 table intervals
    let within = frac & 0x7ff; // position inside the interval, Q11
    let lo = LOG2_TABLE_Q16[index];
    let hi = LOG2_TABLE_Q16[index + 1];
    (msb << 16) + lo + (((hi - lo) * within) >> 11)
}

/// Bytes until the next sample, exponentially distributed with mean `mean`,
/// from 32 random bits. `mean <= 1` samples every allocation (returns 0).
#[inline(always)]
pub fn next_sample_distance(random: u32, mean: u64) -> u64 {
    if mean <= 1 {
        return 0;
    }
    // U in (0, 1]: r / 2^26 with r in 1..=2^26.
    let r = (random & ((1 << RANDOM_BITS) - 1)) + 1;
    // -ln(U) = ln 2 * (26 - log2 r), in Q16.
    let neg_log2 = u64::from((RANDOM_BITS << 16) - log2_q16(r).min(RANDOM_BITS << 16));
    let neg_ln_q16 = (neg_log2 * LN2_Q16) >> 16;
    // At most 26 * 0.7 * 2^16 < 2^21: times a mean below 2^42 cannot overflow.
    let mean = mean.min(1 << 42);
    ((neg_ln_q16 * mean) >> 16) + 1
}

/// Go's block profile rule (runtime/mprof.go, `blocksampled`): an event of
/// `duration_ns` is kept always at or above the rate, and with probability
/// duration/rate below it. `random` is uniform in u32.
#[inline(always)]
pub fn keep_block_event(duration_ns: u64, rate_ns: u64, random: u32) -> bool {
    duration_ns >= rate_ns || (u64::from(random) * rate_ns) >> 32 < duration_ns
}

/// Mutex profile rule: one contended wake-up in `fraction` is kept.
#[inline(always)]
pub fn keep_mutex_event(fraction: u64, random: u32) -> bool {
    fraction <= 1 || u64::from(random) % fraction == 0
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    /// A fixed xorshift so the test is repeatable.
    fn randoms(n: usize) -> impl Iterator<Item = u32> {
        let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
        (0..n).map(move |_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 32) as u32
        })
    }

    #[test]
    fn log2_is_close() {
        for x in [
            1u32,
            2,
            3,
            5,
            100,
            1000,
            65_535,
            1 << 20,
            (1 << 26) - 1,
            u32::MAX,
        ] {
            let exact = f64::from(x).log2();
            let got = f64::from(log2_q16(x)) / 65536.0;
            assert!(
                (got - exact).abs() < 3e-4,
                "log2({x}) = {got}, exact {exact}"
            );
        }
    }

    #[test]
    fn distances_are_exponential_with_the_mean() {
        let mean = 512 * 1024u64;
        let n = 1_000_000;
        let draws: std::vec::Vec<u64> = randoms(n).map(|r| next_sample_distance(r, mean)).collect();
        let avg = draws.iter().sum::<u64>() as f64 / n as f64;
        assert!((avg / mean as f64 - 1.0).abs() < 0.01, "mean {avg}");
        // P(X > k * mean) = e^-k for an exponential distribution.
        for k in [0.5f64, 1.0, 2.0, 4.0] {
            let above = draws
                .iter()
                .filter(|&&d| d as f64 > k * mean as f64)
                .count() as f64
                / n as f64;
            let expected = (-k).exp();
            assert!(
                (above - expected).abs() < 0.01 * expected.max(0.05),
                "P(X > {k}R) = {above}, expected {expected}"
            );
        }
    }

    #[test]
    fn mean_one_samples_everything() {
        assert!(randoms(1000).all(|r| next_sample_distance(r, 1) == 0));
    }
}
