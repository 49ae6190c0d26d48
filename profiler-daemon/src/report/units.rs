//! Values and percentages written the way `go tool pprof` writes them:
//! nanoseconds as ns/us/ms/s/hrs, bytes as B/kB/MB/... (powers of 1024),
//! two decimals with a trailing ".00" dropped, and pprof's percentage
//! column. Users compare our numbers with pprof's, so the rules are pprof's.

/// One unit of a dimension: its printed name, the names a profile may use
/// for it (lower case, plural 's' removed) and its size in the base unit.
struct Unit {
    name: &'static str,
    aliases: &'static [&'static str],
    factor: f64,
}

/// The units of one dimension (time or memory), smallest first, and the
/// unit used when a value is too small for any of them (zero).
struct Dimension {
    units: &'static [Unit],
    default: usize,
}

static DIMENSIONS: [Dimension; 2] = [
    Dimension {
        units: &[
            Unit {
                name: "B",
                aliases: &["b", "byte"],
                factor: 1.0,
            },
            Unit {
                name: "kB",
                aliases: &["kb", "kbyte", "kilobyte"],
                factor: (1u64 << 10) as f64,
            },
            Unit {
                name: "MB",
                aliases: &["mb", "mbyte", "megabyte"],
                factor: (1u64 << 20) as f64,
            },
            Unit {
                name: "GB",
                aliases: &["gb", "gbyte", "gigabyte"],
                factor: (1u64 << 30) as f64,
            },
            Unit {
                name: "TB",
                aliases: &["tb", "tbyte", "terabyte"],
                factor: (1u64 << 40) as f64,
            },
            Unit {
                name: "PB",
                aliases: &["pb", "pbyte", "petabyte"],
                factor: (1u64 << 50) as f64,
            },
        ],
        default: 0,
    },
    Dimension {
        units: &[
            Unit {
                name: "ns",
                aliases: &["ns", "nanosecond"],
                factor: 1.0,
            },
            Unit {
                name: "us",
                aliases: &["μs", "us", "microsecond"],
                factor: 1e3,
            },
            Unit {
                name: "ms",
                aliases: &["ms", "millisecond"],
                factor: 1e6,
            },
            Unit {
                name: "s",
                aliases: &["s", "sec", "second"],
                factor: 1e9,
            },
            Unit {
                name: "hrs",
                aliases: &["hour", "hr"],
                factor: 3600e9,
            },
        ],
        default: 3,
    },
];

/// The unit a profile names (`nanoseconds`, `bytes`, `ms`, ...), with its
/// dimension; `None` for counts and anything unknown.
fn sniff(unit: &str) -> Option<(&'static Dimension, &'static Unit)> {
    let lower = unit.to_lowercase();
    let name = if lower.chars().count() > 2 {
        lower.strip_suffix('s').unwrap_or(&lower)
    } else {
        &lower
    };
    DIMENSIONS.iter().find_map(|d| {
        d.units
            .iter()
            .find(|u| u.aliases.contains(&name))
            .map(|u| (d, u))
    })
}

/// Which unit to convert to: the largest one in which the value is at
/// least 1 (pprof's "minimum"), or a named one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target<'a> {
    Auto,
    Unit(&'a str),
}

/// `value` (in `from`) converted for printing: the number and the unit's
/// printed name ("" for counts).
pub fn scale(value: i64, from: &str, to: Target<'_>) -> (f64, &'static str) {
    if value < 0 {
        let (v, u) = scale(value.saturating_neg(), from, to);
        return (-v, u);
    }
    let Some((dim, from_unit)) = sniff(from) else {
        return (value as f64, "");
    };
    let base = value as f64 * from_unit.factor;
    let to_unit = match to {
        Target::Auto => dim
            .units
            .iter()
            .rev()
            .find(|u| base / u.factor >= 1.0)
            .unwrap_or(&dim.units[dim.default]),
        Target::Unit(name) => match sniff(name) {
            Some((d, u)) if std::ptr::eq(d, dim) => u,
            _ => &dim.units[dim.default],
        },
    };
    (base / to_unit.factor, to_unit.name)
}

/// `value` as pprof prints it: "2.26s", "687.37ms", "1.50MB", "3002", "0".
pub fn label(value: i64, from: &str, to: Target<'_>) -> String {
    let (v, unit) = scale(value, from, to);
    let text = format!("{v:.2}");
    let text = text.strip_suffix(".00").unwrap_or(&text);
    if text == "0" || text == "-0" {
        return "0".to_owned();
    }
    format!("{text}{unit}")
}

/// The unit pprof's text reports use for every value of a table: the one
/// of the smallest non-zero shown value, unless that is under 1/100 of the
/// total, in which case the unit of 100 × the smallest. `None` for counts.
pub fn table_unit(smallest: i64, total: i64, from: &str) -> Option<&'static str> {
    let smallest = if smallest == 0 { total } else { smallest };
    let (_, min_unit) = scale(smallest, from, Target::Auto);
    let (_, max_unit) = scale(total, from, Target::Auto);
    let unit = if min_unit != max_unit && smallest.saturating_mul(100) < total {
        scale(smallest.saturating_mul(100), from, Target::Auto).1
    } else {
        min_unit
    };
    (!unit.is_empty()).then_some(unit)
}

/// pprof's percentage column: "  100%", "75.30%", "  0.2%", "0.067%".
pub fn percentage(value: i64, total: i64) -> String {
    let ratio = if total == 0 {
        0.0
    } else {
        (value as f64 / total as f64).abs() * 100.0
    };
    if (99.95..=100.05).contains(&ratio) {
        "  100%".to_owned()
    } else if ratio >= 1.0 {
        format!("{ratio:5.2}%")
    } else {
        format!("{:>5}%", two_significant(ratio))
    }
}

/// A number below 1 with two significant digits and no trailing zeros, as
/// Go's `%.2g` prints it ("0.2", "0.067", "1.2e-05").
fn two_significant(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return "0".to_owned();
    }
    // Rust rounds to two significant digits here: "6.7e-2".
    let sci = format!("{x:.1e}");
    let Some((mantissa, exp)) = sci.split_once('e') else {
        return sci;
    };
    let exp: i32 = exp.parse().unwrap_or(0);
    let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
    if !(-4..2).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    let decimals = (1 - exp).max(0) as usize;
    let value: f64 = format!("{mantissa}e{exp}").parse().unwrap_or(x);
    let fixed = format!("{value:.decimals$}");
    if fixed.contains('.') {
        fixed.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        fixed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_values_as_pprof_prints_them() {
        let ns = "nanoseconds";
        assert_eq!(label(2_260_520_000, ns, Target::Auto), "2.26s");
        assert_eq!(label(3_000_000_000, ns, Target::Auto), "3s");
        assert_eq!(label(1_500_000_000, ns, Target::Auto), "1.50s");
        assert_eq!(label(687_370_000, ns, Target::Auto), "687.37ms");
        assert_eq!(label(999, ns, Target::Auto), "999ns");
        assert_eq!(label(1_500, ns, Target::Auto), "1.50us");
        assert_eq!(label(7_200_000_000_000, ns, Target::Auto), "2hrs");
        assert_eq!(label(0, ns, Target::Auto), "0");
        assert_eq!(label(-2_000_000, ns, Target::Auto), "-2ms");
        // A fixed unit, as in pprof's tables ("3002ms").
        assert_eq!(label(3_002_000_000, ns, Target::Unit("ms")), "3002ms");
        assert_eq!(label(2_004_008, ns, Target::Unit("ms")), "2ms");
        assert_eq!(label(1_000, ns, Target::Unit("ms")), "0");
    }

    #[test]
    fn byte_values_use_powers_of_1024() {
        assert_eq!(label(512, "bytes", Target::Auto), "512B");
        assert_eq!(label(1024, "bytes", Target::Auto), "1kB");
        assert_eq!(label(1536, "bytes", Target::Auto), "1.50kB");
        assert_eq!(label(5 << 20, "bytes", Target::Auto), "5MB");
        assert_eq!(label(3 << 30, "bytes", Target::Unit("MB")), "3072MB");
    }

    #[test]
    fn counts_have_no_unit() {
        assert_eq!(label(3002, "count", Target::Auto), "3002");
        assert_eq!(label(12, "samples", Target::Unit("count")), "12");
        assert_eq!(table_unit(2, 3002, "count"), None);
    }

    #[test]
    fn table_unit_follows_the_smallest_value() {
        let ns = "nanoseconds";
        // pprof: smallest 2ms, total 3s → everything in ms.
        assert_eq!(table_unit(2_004_000, 3_002_000_000, ns), Some("ms"));
        // Smallest 26ms of 3s: both scale differently, 26ms*100 = 2.6s → s.
        assert_eq!(table_unit(26_000_000, 3_002_000_000, ns), Some("s"));
        // Same unit for both.
        assert_eq!(table_unit(1_500_000_000, 3_000_000_000, ns), Some("s"));
        // No non-zero value: the total decides.
        assert_eq!(table_unit(0, 3_000_000, ns), Some("ms"));
        assert_eq!(table_unit(100, 10 << 20, "bytes"), Some("kB"));
    }

    #[test]
    fn percentages_as_pprof_prints_them() {
        assert_eq!(percentage(7530, 10000), "75.30%");
        assert_eq!(percentage(10000, 10000), "  100%");
        assert_eq!(percentage(2, 1000), "  0.2%");
        assert_eq!(percentage(67, 100_000), "0.067%");
        assert_eq!(percentage(0, 100), "    0%");
        assert_eq!(percentage(5, 0), "    0%");
        assert_eq!(percentage(123, 10_000), " 1.23%");
        assert_eq!(percentage(12, 100_000_000), "1.2e-05%");
    }
}
