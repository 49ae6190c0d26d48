//! The name perf gives a function that has several at one address. glibc
//! names `malloc` also `__libc_malloc`, and in its debug file
//! `__GI___libc_malloc` (a hidden alias for calls from inside the
//! library); blazesym answers with any of them. perf keeps one symbol per
//! address by its rule (`choose_best_symbol` in tools/perf/util/symbol.c):
//! one with a size over one without, a non-weak one over a weak one, a
//! global one over a local one, fewer leading underscores, then the longer
//! name. The same rule here, over the symbol table perf reads (the debug
//! file found by build ID under /usr/lib/debug, else the file's own
//! `.symtab` and `.dynsym`), among the names a user writes only (a
//! default version cut off, `pthread_mutex_lock@@GLIBC_2.2.5` read as
//! `pthread_mutex_lock`; no compatibility version, no mangled or generated
//! alias), so that a profile names glibc's functions as `perf report` does:
//! `malloc`, `__libc_calloc` (`calloc` is weak), `pthread_mutex_lock`; and
//! `free` where perf prints the compatibility symbol `cfree@GLIBC_2.2.5`.
//!
//! Only addresses with two names or more are kept: a few thousand for
//! glibc.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSymbol, ReadCache, SymbolKind};

/// Where Debian (and most distributions) put a file's debug symbols, by
/// its build ID: `.build-id/ab/cdef….debug`.
const DEBUG_ROOT: &str = "/usr/lib/debug/.build-id";

/// How perf ranks a symbol among those at its address: greater is better,
/// compared field by field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Rank {
    sized: bool,
    non_weak: bool,
    global: bool,
    /// Leading underscores, negated: fewer is better.
    underscores: i64,
    len: usize,
}

impl Rank {
    fn of(name: &str, sized: bool, weak: bool, global: bool) -> Self {
        Rank {
            sized,
            non_weak: !weak,
            global,
            underscores: -(name.bytes().take_while(|&b| b == b'_').count() as i64),
            len: name.len(),
        }
    }
}

/// The best name of each aliased address, sorted by address.
#[derive(Debug, Default)]
pub struct SymbolAliases {
    best: Vec<(u64, Box<str>, Rank)>,
    /// Every name of those addresses, hashed, to tell one of them from a
    /// name the table does not hold (a DWARF name).
    names: Vec<(u64, u64)>,
}

impl SymbolAliases {
    /// The aliases of the ELF file at `path` (build ID `build_id`, hex),
    /// from its debug file when there is one. Unreadable: none.
    pub fn read(path: &Path, build_id: Option<&str>) -> Self {
        let debug = build_id.and_then(debug_file).filter(|p| p.exists());
        let from = debug.as_deref().unwrap_or(path);
        match File::open(from) {
            Ok(file) => Self::of_file(&ReadCache::new(file)),
            Err(err) => {
                tracing::debug!(%err, path = %from.display(), "cannot read symbols for aliases");
                Self::default()
            }
        }
    }

    fn of_file(cache: &ReadCache<File>) -> Self {
        let Ok(file) = object::File::parse(cache) else {
            return Self::default();
        };
        let mut at: HashMap<u64, Vec<(String, Rank)>> = HashMap::new();
        for sym in file.symbols().chain(file.dynamic_symbols()) {
            if sym.kind() != SymbolKind::Text || !sym.is_definition() || sym.address() == 0 {
                continue;
            }
            let Ok(name) = sym.name() else { continue };
            // A default version (`pthread_mutex_lock@@GLIBC_2.2.5`) is the
            // name programs link to; perf prints it with its version.
            let name = name.split_once("@@").map_or(name, |(base, _)| base);
            if name.is_empty() {
                continue;
            }
            let rank = Rank::of(name, sym.size() > 0, sym.is_weak(), sym.is_global());
            let names = at.entry(sym.address()).or_default();
            if !names.iter().any(|(n, _)| n == name) {
                names.push((name.to_string(), rank));
            }
        }
        let mut aliases = Self::default();
        for (addr, names) in at.into_iter().filter(|(_, names)| names.len() > 1) {
            if let Some((name, rank)) = names
                .iter()
                .filter(|(name, _)| plain(name))
                .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
            {
                aliases.best.push((addr, name.as_str().into(), *rank));
            }
            aliases
                .names
                .extend(names.iter().map(|(n, _)| (addr, name_hash(n))));
        }
        aliases.best.sort_unstable_by_key(|e| e.0);
        aliases.names.sort_unstable();
        aliases
    }

    /// perf's name for the function at `addr` that blazesym named `found`,
    /// when it is another: `found` is one of the table's names there, or
    /// (a name from DWARF, or a local one of a debug file not read) ranks
    /// as a sized, non-weak, local symbol.
    pub fn perf_name(&self, addr: u64, found: &str) -> Option<&str> {
        let at = self.best.binary_search_by_key(&addr, |e| e.0).ok()?;
        let (_, best, rank) = &self.best[at];
        if **best == *found {
            return None;
        }
        let known = self.names.binary_search(&(addr, name_hash(found))).is_ok();
        (known || *rank > Rank::of(found, true, false, false)).then_some(&**best)
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.best.capacity() * size_of::<(u64, Box<str>, Rank)>()
            + self.best.iter().map(|e| e.1.len()).sum::<usize>()
            + self.names.capacity() * size_of::<(u64, u64)>()
    }
}

/// A name a user writes: no compatibility version (`cfree@GLIBC_2.2.5`;
/// a default one is cut off before this), no
/// mangling (a C++ constructor's C1 alias shares its C2's address and
/// demangles alike; blazesym's demangled name stays), no generated alias
/// (`__libc_start_main_alias_1`). Only these may replace blazesym's.
fn plain(name: &str) -> bool {
    let mangled = name.starts_with("_Z")
        || (name.starts_with("_R") && name[2..].starts_with(|c: char| c.is_ascii_uppercase()));
    !mangled
        && !name.contains("_alias_")
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn name_hash(name: &str) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(name)
}

/// The debug file of build ID `hex` under [`DEBUG_ROOT`].
fn debug_file(hex: &str) -> Option<PathBuf> {
    let (dir, rest) = (hex.get(..2)?, hex.get(2..)?);
    (!rest.is_empty()).then(|| PathBuf::from(format!("{DEBUG_ROOT}/{dir}/{rest}.debug")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_s_rule_orders_aliases() {
        let rank = |name, sized, weak, global| Rank::of(name, sized, weak, global);
        // Non-weak first: `__libc_calloc` over the weak `calloc`.
        assert!(rank("__libc_calloc", true, false, true) > rank("calloc", true, true, true));
        // Global over local: `malloc` over `__GI___libc_malloc`.
        assert!(rank("malloc", true, false, true) > rank("__GI___libc_malloc", true, false, false));
        // Fewer underscores: `malloc` over `__libc_malloc`.
        assert!(rank("malloc", true, false, true) > rank("__libc_malloc", true, false, true));
        // Then the longer name.
        assert!(rank("cfree@GLIBC_2.2.5", true, false, true) > rank("free", true, false, true));
        // A sized symbol over one without a size.
        assert!(rank("__x", true, true, false) > rank("x", false, false, true));
    }

    #[test]
    fn only_plain_names_replace_blazesym_s() {
        for name in [
            "malloc",
            "__libc_calloc",
            "pthread_mutex_lock",
            "x86_64_fallback",
        ] {
            assert!(plain(name), "{name}");
        }
        for name in [
            "cfree@GLIBC_2.2.5",
            "pthread_mutex_lock@@GLIBC_2.2.5",
            "__libc_start_main_alias_1",
            "_ZN8opt_passC1ENS_9pass_dataEP7context",
            "_RNvCs1234_4main",
            "",
        ] {
            assert!(!plain(name) || name.is_empty(), "{name}");
        }
    }

    #[test]
    fn debug_files_are_found_by_build_id() {
        assert_eq!(
            debug_file("93ac61ec").as_deref(),
            Some(Path::new("/usr/lib/debug/.build-id/93/ac61ec.debug"))
        );
        assert_eq!(debug_file("9"), None);
    }

    /// What glibc's table costs to read and keep (design 024):
    /// `cargo test -p profiler-daemon --lib measure_glibc_aliases -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn measure_glibc_aliases() {
        let libc = Path::new("/usr/lib/x86_64-linux-gnu/libc.so.6");
        let data = std::fs::read(libc).expect("glibc");
        let file = object::File::parse(&*data).expect("ELF");
        let id = file
            .build_id()
            .ok()
            .flatten()
            .map(|id| id.iter().map(|b| format!("{b:02x}")).collect::<String>());
        for (what, build_id) in [("with its debug file", id.as_deref()), ("alone", None)] {
            let start = std::time::Instant::now();
            let aliases = SymbolAliases::read(libc, build_id);
            println!(
                "glibc {what}: {} aliased addresses, {} names, {} heap bytes, read in {:?}",
                aliases.best.len(),
                aliases.names.len(),
                aliases.heap_bytes(),
                start.elapsed()
            );
        }
    }
}
