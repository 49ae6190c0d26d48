//! The VM's root file system: a newc cpio archive with static busybox, an
//! init script that prepares what profilerd needs and runs one command
//! between console markers, profilerd with the shared libraries it loads,
//! and the C workloads of `tests/workloads/` built statically (cached under
//! `target/vm/workloads/`).

use std::fs;
use std::io::Write;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use super::console::Markers;

/// Static busybox as Debian's busybox-static installs it.
pub const BUSYBOX: &str = "/bin/busybox";

/// Where the workloads go in the VM (also on its PATH).
pub const WORKLOADS_DIR: &str = "/workloads";

/// What goes into the archive besides busybox and init.
pub struct Contents<'a> {
    /// profilerd, copied to `/bin/profilerd` with its shared libraries.
    pub profilerd: &'a Path,
    /// Static executables, copied to [`WORKLOADS_DIR`] under their names.
    pub workloads: &'a [PathBuf],
    /// Extra files: path in the VM, contents (executable scripts).
    pub scripts: &'a [(String, String)],
    /// Files copied in: path here, path in the VM; executables bring the
    /// shared libraries they load, at the paths they have here.
    pub files: &'a [(PathBuf, PathBuf)],
    /// The shell command line init runs.
    pub command: &'a str,
}

/// Writes the archive to `out` (staging it in `scratch`, which the caller
/// removes) and returns its size in bytes.
pub fn build(contents: &Contents, markers: &Markers, scratch: &Path, out: &Path) -> Result<u64> {
    let tree = scratch.join("tree");
    for dir in [
        "bin", "dev", "proc", "sys", "tmp", "run", "root", "etc", "lib64",
    ] {
        fs::create_dir_all(tree.join(dir))?;
    }
    fs::create_dir_all(tree.join(WORKLOADS_DIR.trim_start_matches('/')))?;
    install_busybox(&tree)?;
    write_executable(&tree.join("init"), &init_script(markers))?;
    write_executable(
        &tree.join("command"),
        &format!("#!/bin/sh\n{}\n", contents.command),
    )?;
    for (path, text) in contents.scripts {
        write_executable(&tree.join(path.trim_start_matches('/')), text)?;
    }
    copy_into(&tree, contents.profilerd, Path::new("/bin/profilerd"))?;
    let mut libraries = std::collections::BTreeSet::new();
    libraries.extend(shared_libraries(contents.profilerd)?);
    for (src, dest) in contents.files {
        copy_into(&tree, src, dest)?;
        if is_elf_executable(src) {
            libraries.extend(shared_libraries(src)?);
        }
    }
    for lib in &libraries {
        copy_into(&tree, lib, lib)?;
        // The libraries' separate debug files (libc6-dbg's), as the host has
        // them: stacks through glibc name its local functions with them.
        if let Some(debug) = debug_file(lib) {
            copy_into(&tree, &debug, &debug)?;
        }
    }
    for exe in contents.workloads {
        let name = exe
            .file_name()
            .with_context(|| format!("{} has no file name", exe.display()))?;
        copy_into(&tree, exe, &Path::new(WORKLOADS_DIR).join(name))?;
    }
    write_cpio(&tree, out)?;
    Ok(fs::metadata(out)?.len())
}

/// The init script: mounts what profilerd uses, raises the limits it needs,
/// runs `/command` between the markers and powers off. The console is only
/// opened once devtmpfs is mounted (the archive holds no device nodes, so
/// that building it needs no privileges).
pub fn init_script(markers: &Markers) -> String {
    format!(
        r#"#!/bin/busybox sh
/bin/busybox mount -t devtmpfs devtmpfs /dev
exec 0</dev/console 1>/dev/console 2>&1
export PATH=/bin:{workloads} HOME=/root TERM=dumb NO_COLOR=1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
# tracefs for tracepoint ids, debugfs for older tools, bpffs and cgroup2
# for what profilerd pins and reads.
mount -t tracefs tracefs /sys/kernel/tracing || echo "init: no tracefs"
mount -t debugfs debugfs /sys/kernel/debug || echo "init: no debugfs"
mount -t bpf bpf /sys/fs/bpf || echo "init: no bpffs"
mount -t cgroup2 cgroup2 /sys/fs/cgroup || echo "init: no cgroup2"
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
# BPF maps are charged to locked memory on kernels before 5.11.
ulimit -l unlimited
ulimit -n 65536
ip link set lo up 2>/dev/null
cd /tmp
echo '{begin}'
sh /command
echo "{end}$?@@"
poweroff -f
# Should power-off fail, the kernel's own request still ends QEMU.
echo o >/proc/sysrq-trigger
"#,
        workloads = WORKLOADS_DIR,
        begin = markers.begin(),
        end = markers.end_prefix(),
    )
}

/// Copies busybox to `/bin/busybox` with a link per applet.
fn install_busybox(tree: &Path) -> Result<()> {
    copy_into(tree, Path::new(BUSYBOX), Path::new("/bin/busybox"))?;
    let list = crate::output(Command::new(BUSYBOX).arg("--list"))
        .with_context(|| format!("{BUSYBOX} --list failed"))?;
    for applet in list.lines().map(str::trim).filter(|a| !a.is_empty()) {
        if applet == "busybox" || applet.contains('/') {
            continue;
        }
        let link = tree.join("bin").join(applet);
        if !link.exists() {
            symlink("busybox", &link).with_context(|| format!("linking {}", link.display()))?;
        }
    }
    Ok(())
}

/// Whether `exe` is statically linked: `ldd` refuses it.
pub fn is_static(exe: &Path) -> bool {
    crate::output(Command::new("ldd").arg(exe)).is_none()
}

/// Whether `path` is an ELF file with an execute bit (sources and data are
/// copied as they are).
fn is_elf_executable(path: &Path) -> bool {
    let executable = fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o111 != 0);
    let mut magic = [0u8; 4];
    executable
        && fs::File::open(path)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
            .is_ok()
        && magic == *b"\x7fELF"
}

/// The shared libraries `exe` loads, the dynamic loader included, as ldd
/// finds them on this machine.
fn shared_libraries(exe: &Path) -> Result<Vec<PathBuf>> {
    if is_static(exe) {
        return Ok(Vec::new());
    }
    let out = crate::output(Command::new("ldd").arg(exe))
        .with_context(|| format!("ldd {} failed", exe.display()))?;
    if let Some(missing) = out.lines().find(|l| l.contains("not found")) {
        bail!(
            "{} needs a library this machine lacks: {}",
            exe.display(),
            missing.trim()
        );
    }
    let libs = ldd_paths(&out);
    if libs.is_empty() {
        bail!("ldd names no libraries for {}:\n{out}", exe.display());
    }
    Ok(libs)
}

/// The separate debug file of `object` under /usr/lib/debug/.build-id, if
/// this machine has one (its build ID as `readelf -n` prints it).
fn debug_file(object: &Path) -> Option<PathBuf> {
    let notes = crate::output(Command::new("readelf").arg("-n").arg(object))?;
    let id = build_id_of(&notes)?;
    let path = PathBuf::from(format!(
        "/usr/lib/debug/.build-id/{}/{}.debug",
        &id[..2],
        &id[2..]
    ));
    path.is_file().then_some(path)
}

/// The build ID in `readelf -n` output: the hex after `Build ID:`.
fn build_id_of(notes: &str) -> Option<String> {
    let id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID:"))?
        .trim();
    (id.len() > 2 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_string())
}

/// The file paths in ldd's output (`name => /path (addr)` and `/path
/// (addr)`), without the vDSO, which has none.
pub fn ldd_paths(ldd: &str) -> Vec<PathBuf> {
    ldd.lines()
        .filter_map(|line| {
            let line = line.trim();
            let target = match line.split_once("=>") {
                Some((_, rest)) => rest.trim(),
                None => line,
            };
            let path = target.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// Copies `src` (following links) to `dest`, an absolute path in the VM,
/// keeping its permissions.
fn copy_into(tree: &Path, src: &Path, dest: &Path) -> Result<()> {
    let target = tree.join(dest.strip_prefix("/").unwrap_or(dest));
    if let Some(dir) = target.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::copy(src, &target)
        .with_context(|| format!("copying {} to {}", src.display(), target.display()))?;
    Ok(())
}

fn write_executable(path: &Path, text: &str) -> Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// Archives `tree` as newc cpio into `out`, owned by root. Uncompressed:
/// gzip made no difference to the boot under TCG (4.4 to 6 s either way,
/// 35 MiB against 15 MiB) and would cost a compression per boot.
fn write_cpio(tree: &Path, out: &Path) -> Result<()> {
    let mut names = Vec::new();
    list_tree(tree, Path::new("."), &mut names)?;
    let file = fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut cpio = Command::new("cpio")
        .args(["--quiet", "-o", "-H", "newc", "-R", "0:0"])
        .current_dir(tree)
        .stdin(Stdio::piped())
        .stdout(file)
        .spawn()
        .context("starting cpio")?;
    {
        let mut stdin = cpio.stdin.take().context("cpio's stdin is piped")?;
        for name in &names {
            stdin.write_all(name.as_os_str().as_encoded_bytes())?;
            stdin.write_all(b"\n")?;
        }
    }
    let status = cpio.wait().context("waiting for cpio")?;
    if !status.success() {
        bail!("cpio failed: {status}");
    }
    Ok(())
}

/// Every path under `dir`, relative to the tree, parents before children
/// and in name order (the same archive for the same files).
fn list_tree(tree: &Path, dir: &Path, names: &mut Vec<PathBuf>) -> Result<()> {
    names.push(dir.to_path_buf());
    let mut entries: Vec<_> = fs::read_dir(tree.join(dir))
        .with_context(|| format!("reading {}", tree.join(dir).display()))?
        .collect::<std::io::Result<_>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let rel = dir.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            list_tree(tree, &rel, names)?;
        } else {
            names.push(rel);
        }
    }
    Ok(())
}

/// How each C workload of `tests/workloads/` is compiled: the flags of
/// `tests/src/workloads.rs` (and of each file's header), plus `-static` so
/// that the VM needs no C library for them.
fn workload_flags(name: &str) -> &'static [&'static str] {
    match name {
        // Built with frame pointers there.
        "cpu_ratio" | "syscalls" | "short_lived" | "exec_burn" | "pid_reuse" | "hostile_names" => {
            &["-O2", "-fno-omit-frame-pointer", "-g", "-pthread"]
        }
        // Built as a user builds it: the bias example.
        "wait_sites" => &[
            "-O1",
            "-g",
            "-fno-omit-frame-pointer",
            "-fno-inline",
            "-pthread",
        ],
        // Built like a distribution's C program, without frame pointers.
        _ => &["-O2", "-g", "-pthread"],
    }
}

/// The C workloads, built statically into `target/vm/workloads/` (each
/// only when missing or older than its source).
pub fn build_workloads(root: &Path) -> Result<Vec<PathBuf>> {
    let src_dir = root.join("tests/workloads");
    let out_dir = root.join("target/vm/workloads");
    fs::create_dir_all(&out_dir)?;
    let mut sources: Vec<PathBuf> = fs::read_dir(&src_dir)
        .with_context(|| format!("reading {}", src_dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "c"))
        .collect();
    sources.sort();
    let mut built = Vec::new();
    for src in sources {
        let name = src
            .file_stem()
            .and_then(|s| s.to_str())
            .with_context(|| format!("{} has no UTF-8 name", src.display()))?;
        let exe = out_dir.join(name);
        if !is_newer(&exe, &src) {
            crate::run(
                Command::new("gcc")
                    .args(workload_flags(name))
                    .args(["-Wall", "-static", "-o"])
                    .arg(&exe)
                    .arg(&src),
            )?;
        }
        built.push(exe);
    }
    Ok(built)
}

/// Whether `a` exists and was modified no earlier than `b`.
fn is_newer(a: &Path, b: &Path) -> bool {
    let modified = |p: &Path| fs::metadata(p).and_then(|m| m.modified()).ok();
    match (modified(a), modified(b)) {
        (Some(a), Some(b)) => a >= b,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_paths_keep_files_and_the_loader() {
        let ldd = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                   \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f01)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f02)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f03)\n";
        assert_eq!(
            ldd_paths(ldd),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
        assert!(ldd_paths("\tstatically linked\n").is_empty());
        assert!(ldd_paths("\tlibmissing.so => not found\n").is_empty());
    }

    #[test]
    fn build_ids_are_read_from_readelf_notes() {
        let notes = "Displaying notes found in: .note.gnu.build-id\n  Owner  Data size \tDescription\n  GNU  0x00000014\tNT_GNU_BUILD_ID (unique build ID bitstring)\n    Build ID: 93ac61ec5a8eb1396f9fbd350e3169a558528a40\n";
        assert_eq!(
            build_id_of(notes).as_deref(),
            Some("93ac61ec5a8eb1396f9fbd350e3169a558528a40")
        );
        assert_eq!(build_id_of("no notes\n"), None);
        assert_eq!(build_id_of("    Build ID: zz\n"), None);
    }

    #[test]
    fn init_prints_both_markers_and_powers_off() {
        let m = Markers::new("n1");
        let init = init_script(&m);
        assert!(init.contains(&format!("echo '{}'", m.begin())));
        assert!(init.contains(&format!("echo \"{}$?@@\"", m.end_prefix())));
        let run = init.find("sh /command").unwrap();
        assert!(init.find(&m.begin()).unwrap() < run);
        assert!(run < init.find("poweroff -f").unwrap());
        for fs in ["proc", "sysfs", "tracefs", "bpf", "cgroup2", "tmpfs"] {
            assert!(init.contains(&format!("-t {fs} ")), "{fs}");
        }
    }

    #[test]
    fn workloads_keep_their_test_flags() {
        assert!(workload_flags("cpu_ratio").contains(&"-fno-omit-frame-pointer"));
        assert!(workload_flags("wait_sites").contains(&"-fno-inline"));
        assert!(!workload_flags("mixed").contains(&"-fno-omit-frame-pointer"));
    }
}
