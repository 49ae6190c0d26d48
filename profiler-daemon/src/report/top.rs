//! `profilerd top`: the functions with the largest values, as
//! `go tool pprof -top` prints them. A function's flat value is what its
//! own code (the leaf frame) took; its cumulative value counts each sample
//! once however often the function appears in the stack (recursion,
//! inlining).

use std::collections::HashMap;

use super::stacks::Stacks;
use super::units::{self, Target};

/// pprof's default `-edgefraction`: calls below this share of the total
/// are dropped from its graph.
const EDGE_FRACTION: f64 = 0.001;

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub name: String,
    pub flat: i64,
    pub cum: i64,
    /// pprof's "(inline)" when every call into the function was inlined,
    /// "(partial-inline)" when some were; "" otherwise. Calls lighter than
    /// pprof's default edge fraction of the total are not looked at, as
    /// pprof drops those edges before it marks inlining.
    pub inline: &'static str,
}

/// How rows are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Flat value, then name, then cumulative value (pprof's default).
    Flat,
    /// Cumulative value, then name, then flat value (pprof's `-cum`).
    Cum,
}

/// Every function with its flat and cumulative values, sorted.
pub fn rows(stacks: &Stacks, order: Order) -> Vec<Row> {
    let mut flat: HashMap<u32, i64> = HashMap::new();
    let mut cum: HashMap<u32, i64> = HashMap::new();
    // Caller → callee: inlined in every stack that has this call, and the
    // call's weight (each stack counted once).
    let mut calls: HashMap<(u32, u32), (bool, i64)> = HashMap::new();
    let mut seen: Vec<u32> = Vec::new();
    let mut seen_calls: Vec<(u32, u32)> = Vec::new();
    let mut total: i64 = 0;
    for stack in &stacks.stacks {
        let Some(leaf) = stack.frames.first() else {
            continue;
        };
        // Saturating: files may hold any values, and summing them must not
        // overflow.
        let f = flat.entry(leaf.name).or_insert(0);
        *f = f.saturating_add(stack.value);
        total = total.saturating_add(stack.value.saturating_abs());
        seen.clear();
        seen_calls.clear();
        let mut caller: Option<u32> = None;
        for frame in stack.frames.iter().rev() {
            if !seen.contains(&frame.name) {
                seen.push(frame.name);
                let c = cum.entry(frame.name).or_insert(0);
                *c = c.saturating_add(stack.value);
            }
            if let Some(c) = caller.filter(|&c| c != frame.name) {
                let (all_inline, weight) = calls.entry((c, frame.name)).or_insert((true, 0));
                *all_inline &= frame.inline;
                if !seen_calls.contains(&(c, frame.name)) {
                    seen_calls.push((c, frame.name));
                    *weight = weight.saturating_add(stack.value);
                }
            }
            caller = Some(frame.name);
        }
    }
    let cutoff = (total as f64 * EDGE_FRACTION) as i64;
    let mut inlined: HashMap<u32, (bool, bool)> = HashMap::new();
    for (&(_, callee), &(inline, weight)) in &calls {
        if weight.saturating_abs() < cutoff {
            continue;
        }
        let (some_inline, some_not) = inlined.entry(callee).or_insert((false, false));
        if inline {
            *some_inline = true;
        } else {
            *some_not = true;
        }
    }
    let mut rows: Vec<Row> = cum
        .into_iter()
        .map(|(id, cum)| Row {
            name: stacks.name(id).to_owned(),
            flat: flat.get(&id).copied().unwrap_or(0),
            cum,
            inline: match inlined.get(&id) {
                Some((true, false)) => "(inline)",
                Some((true, true)) => "(partial-inline)",
                _ => "",
            },
        })
        .collect();
    match order {
        Order::Flat => rows.sort_by(|a, b| {
            b.flat
                .unsigned_abs()
                .cmp(&a.flat.unsigned_abs())
                .then_with(|| a.name.cmp(&b.name))
                .then_with(|| b.cum.unsigned_abs().cmp(&a.cum.unsigned_abs()))
        }),
        Order::Cum => rows.sort_by(|a, b| {
            b.cum
                .unsigned_abs()
                .cmp(&a.cum.unsigned_abs())
                .then_with(|| a.name.cmp(&b.name))
                .then_with(|| b.flat.unsigned_abs().cmp(&a.flat.unsigned_abs()))
        }),
    }
    rows
}

/// The whole report: header lines, then the first `nodecount` rows (all
/// when 0).
pub fn render(stacks: &Stacks, order: Order, nodecount: usize) -> String {
    let all = rows(stacks, order);
    let shown = if nodecount == 0 {
        &all[..]
    } else {
        &all[..all.len().min(nodecount)]
    };
    let from = stacks.unit.as_str();
    let smallest = shown
        .iter()
        .map(|r| {
            if r.flat != 0 {
                r.flat.saturating_abs()
            } else {
                r.cum.saturating_abs()
            }
        })
        .filter(|&v| v > 0)
        .min()
        .unwrap_or(0);
    let unit = units::table_unit(smallest, stacks.total, from);
    let target = unit.map_or(Target::Unit(from), Target::Unit);
    let value = |v: i64| units::label(v, from, target);

    let mut lines: Vec<String> = Vec::new();
    let files: Vec<String> = stacks
        .files
        .iter()
        .map(|f| f.display().to_string())
        .collect();
    lines.push(match files.as_slice() {
        [one] => format!("File: {one}"),
        many if many.len() <= 3 => format!("Files: {}", many.join(", ")),
        many => format!(
            "Files: {}, ... {} ({} files)",
            many[..2].join(", "),
            many[many.len() - 1],
            many.len()
        ),
    });
    lines.push(format!("Profile: {}", stacks.profile_type));
    lines.push(format!("Type: {}", stacks.sample_type));
    if stacks.time_nanos > 0 {
        let time =
            std::time::UNIX_EPOCH + std::time::Duration::from_nanos(stacks.time_nanos as u64);
        lines.push(format!("Time: {}", humantime::format_rfc3339_seconds(time)));
    }
    if stacks.duration_nanos != 0 {
        // pprof adds the total's share of the duration when it is a time.
        let (total_ns, total_unit) = units::scale(stacks.total, from, Target::Unit("ns"));
        let ratio = if total_unit == "ns" && total_ns != 0.0 {
            format!(
                " ({})",
                units::percentage(total_ns as i64, stacks.duration_nanos)
            )
        } else {
            String::new()
        };
        lines.push(format!(
            "Duration: {}, Total samples = {}{ratio}",
            units::label(stacks.duration_nanos, "nanoseconds", Target::Auto),
            value(stacks.total)
        ));
    }
    let flat_sum = shown.iter().fold(0i64, |sum, r| sum.saturating_add(r.flat));
    lines.push(format!(
        "Showing nodes accounting for {}, {} of {} total",
        value(flat_sum),
        units::percentage(flat_sum, stacks.total).trim(),
        value(stacks.total)
    ));
    if shown.len() < all.len() {
        lines.push(format!(
            "Showing top {} nodes out of {}",
            shown.len(),
            all.len()
        ));
    }
    lines.push(format!(
        "{:>10} {:>5}% {:>5}% {:>10} {:>5}%",
        "flat", "flat", "sum", "cum", "cum"
    ));
    let mut sum = 0i64;
    for row in shown {
        sum = sum.saturating_add(row.flat);
        let inline = if row.inline.is_empty() {
            String::new()
        } else {
            format!(" {}", row.inline)
        };
        lines.push(format!(
            "{:>10} {} {} {:>10} {}  {}{inline}",
            value(row.flat),
            units::percentage(row.flat, stacks.total),
            units::percentage(sum, stacks.total),
            value(row.cum),
            units::percentage(row.cum, stacks.total),
            row.name,
        ));
    }
    lines.push(String::new());
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::stacks::load;
    use crate::report::stacks::tests::{profile, write};

    fn stacks(samples: &[(&[&str], i64, i64)]) -> Stacks {
        let dir = tempfile::tempdir().unwrap();
        let f = write(dir.path(), "cpu-x.pb.gz", &profile(samples));
        load(&[f], None).unwrap()
    }

    fn row(name: &str, flat: i64, cum: i64, inline: &'static str) -> Row {
        Row {
            name: name.into(),
            flat,
            cum,
            inline,
        }
    }

    #[test]
    fn flat_goes_to_the_leaf_and_cum_counts_once_per_sample() {
        let s = stacks(&[
            // recursion: rec appears twice, counted once in cum.
            (&["rec", "rec", "main"], 1, 30_000_000),
            // inlined: hot is inlined into caller; flat to hot.
            (&["hot+caller", "main"], 1, 50_000_000),
            (&["caller", "main"], 1, 20_000_000),
            // mid is inlined into main, and called by other: pprof marks
            // a function by its incoming calls.
            (&["leaf", "mid+main"], 1, 1_000_000),
            (&["leaf", "mid", "other", "main"], 1, 1_000_000),
        ]);
        assert_eq!(
            rows(&s, Order::Flat),
            vec![
                row("hot", 50_000_000, 50_000_000, "(inline)"),
                row("rec", 30_000_000, 30_000_000, ""),
                row("caller", 20_000_000, 70_000_000, ""),
                row("leaf", 2_000_000, 2_000_000, ""),
                row("main", 0, 102_000_000, ""),
                row("mid", 0, 2_000_000, "(partial-inline)"),
                row("other", 0, 1_000_000, ""),
            ]
        );
        assert_eq!(
            rows(&s, Order::Cum)
                .iter()
                .map(|r| r.name.as_str())
                .collect::<Vec<_>>(),
            ["main", "caller", "hot", "rec", "leaf", "mid", "other"]
        );
    }

    #[test]
    fn light_calls_do_not_mark_inlining() {
        // tiny's only call weighs 0.05% of the total, under pprof's 0.1%
        // edge fraction: pprof drops the edge and shows no mark.
        let s = stacks(&[
            (&["tiny+main"], 1, 2_000_000),
            (&["big+main"], 1, 3_998_000_000),
        ]);
        let marks: Vec<(String, &str)> = rows(&s, Order::Flat)
            .into_iter()
            .map(|r| (r.name, r.inline))
            .collect();
        assert_eq!(
            marks,
            [
                ("big".to_owned(), "(inline)"),
                ("tiny".to_owned(), ""),
                ("main".to_owned(), "")
            ]
        );
    }

    #[test]
    fn ties_sort_by_name() {
        let s = stacks(&[(&["b"], 1, 10), (&["a"], 1, 10), (&["c"], 1, 20)]);
        let names: Vec<String> = rows(&s, Order::Flat).into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["c", "a", "b"]);
    }

    #[test]
    fn report_text() {
        let s = stacks(&[
            (&["burn_a", "main"], 300, 3_000_000_000),
            (&["burn_b", "main"], 100, 1_000_000_000),
            (&["tiny", "main"], 1, 2_000_000),
        ]);
        let text = render(&s, Order::Flat, 2);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("File: ") && lines[0].ends_with("cpu-x.pb.gz"));
        assert_eq!(lines[1], "Profile: cpu");
        assert_eq!(lines[2], "Type: cpu");
        assert!(
            lines[3].starts_with("Time: 2023-11-14T22:13:20Z"),
            "{}",
            lines[3]
        );
        // 4.002 s of samples in a 2 s window (as with two CPUs busy).
        assert_eq!(lines[4], "Duration: 2s, Total samples = 4s (200.10%)");
        assert_eq!(
            lines[5],
            // 99.95% is "100%" for pprof too.
            "Showing nodes accounting for 4s, 100% of 4s total"
        );
        assert_eq!(lines[6], "Showing top 2 nodes out of 4");
        assert_eq!(lines[7], "      flat  flat%   sum%        cum   cum%");
        assert_eq!(
            lines[8],
            "        3s 74.96% 74.96%         3s 74.96%  burn_a"
        );
        assert_eq!(
            lines[9],
            "        1s 24.99%   100%         1s 24.99%  burn_b"
        );
        assert_eq!(lines.len(), 10);

        // With every row, the smallest (2ms) sets the unit, as in pprof.
        let text = render(&s, Order::Flat, 0);
        assert!(
            text.contains("\n    3000ms 74.96% 74.96%     3000ms 74.96%  burn_a\n"),
            "{text}"
        );
        assert!(
            text.contains("\n       2ms  0.05%   100%        2ms  0.05%  tiny\n"),
            "{text}"
        );
        assert!(
            text.contains("\n         0     0%   100%     4002ms   100%  main\n"),
            "{text}"
        );
    }
}
