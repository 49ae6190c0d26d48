//! One-off names for a process's addresses (`/debug/pprof/symbol`): a
//! fresh blazesym symbolizer over the process's own mappings and perf
//! map, dropped with the answer, so that a request neither fills nor waits
//! on the session's caches. Native code and perf-map JIT names only: the
//! Go function table, CPython's frames and perf's names for aliases are
//! the profiles' (they come named).

use blazesym::symbolize::source::{Process, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};

/// The function at each of `addrs` in process `pid` (None where nothing is
/// known), or why the process could not be read.
pub fn name_addresses(pid: u32, addrs: &[u64]) -> Result<Vec<Option<String>>, String> {
    if pid == 0 {
        // blazesym reads pid 0 as its own process.
        return Err("no process 0".into());
    }
    let source = Source::Process(Process::new(pid.into()));
    let symbolizer = Symbolizer::new();
    let answers = symbolizer
        .symbolize(&source, Input::AbsAddr(addrs))
        .map_err(|e| format!("process {pid}: {e}"))?;
    Ok(answers
        .iter()
        .map(|answer| match answer {
            Symbolized::Sym(sym) => Some(sym.name.to_string()),
            Symbolized::Unknown(_) => None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn a_function_to_look_up() -> u64 {
        std::hint::black_box(7)
    }

    #[test]
    fn own_function_named() {
        let addr = a_function_to_look_up as *const () as u64;
        let names = name_addresses(std::process::id(), &[addr, 1]).expect("own process");
        assert!(
            names[0]
                .as_deref()
                .is_some_and(|n| n.contains("a_function_to_look_up")),
            "{names:?}"
        );
        assert_eq!(names[1], None);
        assert!(name_addresses(0, &[addr]).is_err());
    }
}
