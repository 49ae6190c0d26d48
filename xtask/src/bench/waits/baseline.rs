//! `cargo xtask bench --waits --baseline BIN`: every profilerd setup runs
//! again with BIN, an earlier build of the daemon, in the same rotation of
//! rounds and against the same runs without a profiler, so that drifts of
//! the machine fall on both builds alike; the report then sets the two
//! side by side.

use std::path::Path;

use anyhow::Result;

use super::{RATE_CALLS, RATE_PROFILES, Rate, RateOutcome, Results, SETUPS, Setup, median};

/// The largest ratio this build / baseline of a target row that is met
/// ("within 10%").
const TOLERANCE: f64 = 1.10;
/// Programs that ran less often than this per round trip are left out of
/// the comparison.
const MIN_RUNS_PER_TRIP: f64 = 0.1;
/// Runs of the daemon under load for each profile list and build when
/// there is a baseline: one run's share varies by more than the tolerance.
const RATE_RUNS_WITH_BASELINE: usize = 3;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Build {
    /// target/release/profilerd of this checkout.
    Current,
    /// The binary given with --baseline.
    Baseline,
}

impl Build {
    /// `what`, marked when it ran with the baseline binary.
    pub(super) fn label(self, what: &str) -> String {
        match self {
            Build::Current => what.to_string(),
            Build::Baseline => format!("{what} (baseline)"),
        }
    }
}

/// The daemon binaries that run.
pub(super) struct Daemons<'a> {
    pub(super) current: &'a Path,
    pub(super) baseline: Option<&'a Path>,
}

impl Daemons<'_> {
    pub(super) fn builds(&self) -> Vec<Build> {
        let mut builds = vec![Build::Current];
        if self.baseline.is_some() {
            builds.push(Build::Baseline);
        }
        builds
    }

    pub(super) fn bin(&self, build: Build) -> &Path {
        match build {
            Build::Current => self.current,
            Build::Baseline => self
                .baseline
                .expect("baseline cases run only with a baseline binary"),
        }
    }
}

/// A setup and the build of the daemon it runs (setups without profilerd
/// run once, as `Current`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Case {
    pub(super) setup: Setup,
    pub(super) build: Build,
}

impl Case {
    pub(super) fn current(setup: Setup) -> Case {
        Case {
            setup,
            build: Build::Current,
        }
    }

    pub(super) fn label(self) -> String {
        self.build.label(self.setup.label())
    }

    /// The same workload without a profiler, shared by both builds.
    pub(super) fn unprofiled(self) -> Case {
        Case::current(self.setup.unprofiled())
    }

    /// The empty programs on the same tracepoints.
    pub(super) fn floor(self) -> Option<Case> {
        self.setup.floor().map(Case::current)
    }
}

/// Every setup, each profilerd setup followed by its baseline run when
/// there is a baseline binary.
pub(super) fn cases(daemons: &Daemons) -> Vec<Case> {
    let builds = daemons.builds();
    SETUPS
        .iter()
        .flat_map(|&setup| {
            builds
                .iter()
                .filter(move |&&build| build == Build::Current || setup.profiles().is_some())
                .map(move |&build| Case { setup, build })
        })
        .collect()
}

/// The daemon under the steady futex load, with one build.
pub(super) struct RateRun {
    pub(super) profiles: &'static str,
    pub(super) build: Build,
    /// Its number when each build runs more than once.
    run: Option<usize>,
    pub(super) outcome: RateOutcome,
}

impl RateRun {
    pub(super) fn label(&self) -> String {
        let label = self.build.label(self.profiles);
        match self.run {
            Some(n) => format!("{label}, run {n}"),
            None => label,
        }
    }
}

/// Runs `rate` (profiles, daemon binary) for each profile list and build;
/// with a baseline several times, the two builds taking turns to go first.
pub(super) fn rate_runs(
    daemons: &Daemons,
    mut rate: impl FnMut(&str, &Path) -> Result<RateOutcome>,
) -> Result<Vec<RateRun>> {
    let repeats = match daemons.baseline {
        Some(_) => RATE_RUNS_WITH_BASELINE,
        None => 1,
    };
    let mut runs = Vec::new();
    for profiles in RATE_PROFILES {
        for k in 0..repeats {
            let mut builds = daemons.builds();
            if k % 2 == 1 {
                builds.reverse();
            }
            for build in builds {
                let mut run = RateRun {
                    profiles,
                    build,
                    run: (repeats > 1).then_some(k + 1),
                    outcome: RateOutcome::Refused(String::new()),
                };
                eprintln!(
                    "waits bench: {RATE_CALLS} futex calls per second, {}",
                    run.label()
                );
                run.outcome = rate(profiles, daemons.bin(build))?;
                runs.push(run);
            }
        }
    }
    Ok(runs)
}

#[derive(Clone, Copy)]
enum Unit {
    /// Time added over no profiler.
    Added,
    Ns,
    /// Percent of one core.
    Share,
    Count,
}

impl Unit {
    fn show(self, value: Option<f64>) -> String {
        match (self, value) {
            (_, None) => "–".into(),
            (Unit::Added, Some(v)) => format!("{v:+.0} ns"),
            (Unit::Ns, Some(v)) => format!("{v:.0} ns"),
            (Unit::Share, Some(v)) => format!("{v:.2}%"),
            (Unit::Count, Some(v)) => format!("{v:.2}"),
        }
    }
}

/// One measure of both builds.
struct Row {
    what: String,
    unit: Unit,
    /// A cost that must stay within TOLERANCE of the baseline's.
    target: bool,
    current: Option<f64>,
    baseline: Option<f64>,
}

impl Row {
    fn new(what: String, unit: Unit, target: bool, of: impl Fn(Build) -> Option<f64>) -> Row {
        Row {
            what,
            unit,
            target,
            current: of(Build::Current),
            baseline: of(Build::Baseline),
        }
    }

    fn ratio(&self) -> String {
        let (Some(current), Some(baseline)) = (self.current, self.baseline) else {
            return "–".into();
        };
        if baseline <= 0.0 {
            return "–".into();
        }
        let ratio = current / baseline;
        if self.target {
            let verdict = if ratio <= TOLERANCE { "met" } else { "missed" };
            format!("**{ratio:.2}** (≤ {TOLERANCE:.2}: {verdict})")
        } else {
            format!("{ratio:.2}")
        }
    }
}

/// The profiles of a profilerd setup, as the rows name it.
fn short(setup: Setup) -> &'static str {
    setup
        .label()
        .strip_prefix("profilerd --profiles ")
        .unwrap_or(setup.label())
}

/// The report's side-by-side section.
pub(super) fn section(results: &Results, rates: &[RateRun]) -> String {
    let mut rows = Vec::new();
    for (setup, per, target) in [
        (Setup::BlockMutex, "wait/wake pair", true),
        (Setup::Offcpu, "context switch", true),
        (Setup::All, "pair (one wait, one wake, one switch)", false),
        (
            Setup::CondBlockMutex,
            "pthread_cond_wait/signal pair",
            false,
        ),
    ] {
        let what = format!("{}: added per {per} vs no profiler", short(setup));
        rows.push(Row::new(what, Unit::Added, target, |build| {
            let case = Case { setup, build };
            match setup {
                Setup::Offcpu => results.per_switch(case, case.unprofiled()),
                _ => results.per_pair(case, case.unprofiled()),
            }
        }));
    }
    for setup in SETUPS.into_iter().filter(|s| s.profiles().is_some()) {
        let bpf = |build| results.get(Case { setup, build })?.bpf.as_ref();
        let name = short(setup);
        rows.push(Row::new(
            format!("{name}: BPF runs per round trip"),
            Unit::Count,
            false,
            |build| Some(bpf(build)?.runs_per_trip()),
        ));
        rows.push(Row::new(
            format!("{name}: BPF ns per round trip"),
            Unit::Ns,
            false,
            |build| Some(bpf(build)?.ns_per_trip()),
        ));
        // The workload's programs; process and exec events of other
        // processes run the rest a few times.
        let mut programs: Vec<&str> = Vec::new();
        for b in [Build::Current, Build::Baseline]
            .into_iter()
            .filter_map(bpf)
        {
            for p in &b.programs {
                let per_trip = p.runs as f64 / b.trips.max(1) as f64;
                if per_trip >= MIN_RUNS_PER_TRIP && !programs.contains(&p.name.as_str()) {
                    programs.push(&p.name);
                }
            }
        }
        for program in programs {
            rows.push(Row::new(
                format!("{name}: {program}, ns per run"),
                Unit::Ns,
                false,
                |build| {
                    let p = bpf(build)?.programs.iter().find(|p| p.name == program)?;
                    Some(p.ns_per_run)
                },
            ));
        }
    }
    for profiles in RATE_PROFILES {
        // The median over the build's runs.
        let rate = |build, of: fn(&Rate) -> Option<f64>| {
            let values: Vec<f64> = rates
                .iter()
                .filter(|r| r.profiles == profiles && r.build == build)
                .filter_map(|r| match &r.outcome {
                    RateOutcome::Done(rate) => of(rate),
                    RateOutcome::Refused(_) => None,
                })
                .collect();
            (!values.is_empty()).then(|| median(&values))
        };
        rows.push(Row::new(
            format!("daemon under {RATE_CALLS} futex calls/s, {profiles}: % of one core"),
            Unit::Share,
            true,
            |build| rate(build, |r| Some(r.share())),
        ));
        rows.push(Row::new(
            format!("daemon under {RATE_CALLS} futex calls/s, {profiles}: CPU per stack unwound"),
            Unit::Ns,
            false,
            |build| rate(build, Rate::per_stack),
        ));
    }

    let mut out = format!(
        "\n## This build against the baseline\n\n\
         Every profilerd setup ran with both binaries in the same rounds (the rows marked \
         \"(baseline)\" below), against the same runs without a profiler; the daemon's \
         figures under load are medians of {RATE_RUNS_WITH_BASELINE} runs of each, the two \
         builds taking turns to go first. Ratios are this build / baseline; \
         the rows in bold must stay within {:.0}% (ratio ≤ {TOLERANCE:.2}). BPF programs \
         are those that ran at least {MIN_RUNS_PER_TRIP} times per round trip.\n\n\
         | measure | this build | baseline | this / baseline |\n|---|---|---|---|\n",
        (TOLERANCE - 1.0) * 100.0
    );
    for row in &rows {
        out += &format!(
            "| {} | {} | {} | {} |\n",
            row.what,
            row.unit.show(row.current),
            row.unit.show(row.baseline),
            row.ratio()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baseline_cases_follow_their_setups() {
        let daemons = Daemons {
            current: Path::new("new"),
            baseline: Some(Path::new("old")),
        };
        let all = cases(&daemons);
        let profiled = SETUPS.iter().filter(|s| s.profiles().is_some()).count();
        assert_eq!(all.len(), SETUPS.len() + profiled);
        for (i, case) in all.iter().enumerate() {
            if case.build == Build::Baseline {
                assert_eq!(all[i - 1], Case::current(case.setup));
                assert_eq!(daemons.bin(case.build), Path::new("old"));
            }
        }
        let alone = Daemons {
            current: Path::new("new"),
            baseline: None,
        };
        assert_eq!(cases(&alone).len(), SETUPS.len());
    }

    #[test]
    fn ratios() {
        let row = |target, current, baseline| Row {
            what: String::new(),
            unit: Unit::Added,
            target,
            current,
            baseline,
        };
        assert_eq!(
            row(true, Some(320.0), Some(300.0)).ratio(),
            "**1.07** (≤ 1.10: met)"
        );
        assert_eq!(
            row(true, Some(340.0), Some(300.0)).ratio(),
            "**1.13** (≤ 1.10: missed)"
        );
        assert_eq!(row(false, Some(150.0), Some(300.0)).ratio(), "0.50");
        assert_eq!(row(false, None, Some(300.0)).ratio(), "–");
        assert_eq!(row(false, Some(5.0), Some(-3.0)).ratio(), "–");
        assert_eq!(Unit::Added.show(Some(344.2)), "+344 ns");
        assert_eq!(Unit::Share.show(Some(0.244)), "0.24%");
    }
}
