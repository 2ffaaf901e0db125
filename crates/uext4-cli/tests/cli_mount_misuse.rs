//! `uext4 mount` under misuse and failure, judged from outside: CLI writes to a
//! mounted image are refused; `umount` fails when the daemon died before it
//! wrote everything back; a request that panics gets EIO instead of hanging its
//! caller, over /dev/fuse and over io_uring; `uext4 sync` makes everything
//! durable before a crash of the daemon (the kernel's journal replay and e2fsck
//! judge); and setuid/setgid bits change exactly as the kernel's ext4, running
//! the same steps side by side, changes them.

mod common;

use common::*;
use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn mounted(dir: &Path) -> bool {
    let table = fs::read_to_string("/proc/self/mounts").unwrap();
    let dir = dir.to_string_lossy();
    table.lines().any(|l| l.split(' ').nth(1) == Some(&*dir))
}

fn wait_until(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {secs}s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A `uext4 mount --foreground` daemon this test started (so it can kill it
/// and read what it logged).
struct Daemon {
    child: Child,
    dir: PathBuf,
}

impl Daemon {
    fn start(image: &Path, dir: &Path, options: &str, env: &[(&str, &str)]) -> Daemon {
        let mut cmd = uext4();
        cmd.arg("mount").arg("--foreground").args(["-o", options]).arg(image).arg(dir);
        cmd.envs(env.iter().copied()).stdout(Stdio::null()).stderr(Stdio::piped());
        let child = cmd.spawn().unwrap();
        let mut d = Daemon { child, dir: dir.to_path_buf() };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !mounted(dir) {
            if let Some(status) = d.child.try_wait().unwrap() {
                panic!("the daemon exited ({status}) before mounting: {}", d.stderr());
            }
            assert!(Instant::now() < deadline, "the foreground mount never came up");
            std::thread::sleep(Duration::from_millis(10));
        }
        d
    }

    fn kill(&mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        self.child.wait().unwrap();
    }

    fn stderr(&mut self) -> String {
        let mut text = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            e.read_to_string(&mut text).unwrap();
        }
        text
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if mounted(&self.dir) {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

/// What debugfs prints on stdout (its banner goes to stderr).
fn debugfs(image: &Path, request: &str) -> String {
    let out = Command::new("debugfs").arg("-R").arg(request).arg(image).output().unwrap();
    assert!(out.status.success(), "debugfs -R {request}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Names in the root directory of the image, as debugfs lists them.
fn names_in_root(image: &Path) -> Vec<String> {
    debugfs(image, "ls -p /")
        .lines()
        .filter_map(|l| l.split('/').nth(5).map(str::to_string))
        .filter(|n| !n.is_empty())
        .collect()
}

/// CLI commands that write refuse a mounted image, by the holder's name,
/// before changing anything; reading ones warn; after the unmount all work.
#[test]
fn cli_writes_to_a_mounted_image_are_refused() {
    if !fuse_oracles() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("img");
    mkfs(&image, "64M");
    let host = work.path().join("host.txt");
    fs::write(&host, "from the host").unwrap();
    let m = UextMount::new(&image, "");
    fs::write(m.dir.join("through-the-mount"), "served").unwrap();
    let i = image.display().to_string();
    for args in [
        vec!["mkdir".to_string(), format!("{i}:/cli-dir")],
        vec!["cp".into(), host.display().to_string(), format!("{i}:/cli-file")],
        vec!["rm".into(), format!("{i}:/through-the-mount")],
        vec!["chmod".into(), "600".into(), format!("{i}:/through-the-mount")],
        vec!["mkfs".into(), "--size".into(), "64M".into(), i.clone()],
    ] {
        let out = uext4().args(&args).output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code() == Some(1) && said.contains(&format!("held by uext4 at {}", m.dir.display())),
            "uext4 {args:?}: {out:?}"
        );
    }
    let out = uext4().arg("ls").arg(format!("{i}:/")).output().unwrap();
    let (listed, said) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && listed.contains("lost+found"), "{out:?}");
    assert!(said.contains("warning") && said.contains("in use by uext4 at"), "{said}");
    // The mount is unharmed and still the only writer.
    fs::write(m.dir.join("after"), "still served").unwrap();
    m.unmount();
    assert_e2fsck_clean(&image);
    assert_eq!(debugfs(&image, "cat /through-the-mount"), "served");
    assert_eq!(debugfs(&image, "cat /after"), "still served");
    let names = names_in_root(&image);
    assert!(!names.iter().any(|n| n.starts_with("cli-")), "a refused command changed the image: {names:?}");
    run(uext4().arg("mkdir").arg(format!("{i}:/cli-dir")));
    assert_e2fsck_clean(&image);

    // The kernel's loop mount holds the image the same way.
    {
        let k = KernelMount::new(&image, "");
        let out = uext4().arg("mkdir").arg(format!("{i}:/while-the-kernel-has-it")).output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code() == Some(1) && said.contains("the kernel") && said.contains(&*k.dir.to_string_lossy()),
            "{out:?}"
        );
        let other = work.path().join("other");
        fs::create_dir(&other).unwrap();
        let out = uext4().arg("mount").arg(&image).arg(&other).output().unwrap();
        assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("the kernel"), "{out:?}");
        assert!(!mounted(&other));
    }
    assert_e2fsck_clean(&image);
    assert!(!names_in_root(&image).iter().any(|n| n == "while-the-kernel-has-it"));
}

/// `uext4 umount` succeeds only when the daemon wrote everything back: a daemon
/// killed during its write-back, or before the umount, makes it fail.
#[test]
fn umount_fails_when_the_daemon_dies_before_its_write_back() {
    if !fuse_oracles() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("img");
    mkfs(&image, "64M");
    let dir = work.path().join("mnt");
    fs::create_dir(&dir).unwrap();
    let make_files = |prefix: &str| {
        for n in 0..40 {
            fs::write(dir.join(format!("{prefix}{n}")), format!("file {n}")).unwrap();
        }
    };
    let count = |prefix: &str| names_in_root(&image).iter().filter(|n| n.starts_with(prefix)).count();

    // Killed while writing back (the write-back is slowed down so the kill lands in it).
    let mut d = Daemon::start(&image, &dir, "commit=600", &[("UEXT4_TEST_STALL_WRITEBACK_MS", "3000")]);
    make_files("a");
    let umount = uext4().arg("umount").arg(&dir).stderr(Stdio::piped()).spawn().unwrap();
    wait_until("the mount goes away", 20, || !mounted(&dir));
    std::thread::sleep(Duration::from_millis(20));
    d.kill();
    let out = umount.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(1) && said.contains("before it had written everything back"), "{out:?}");
    assert!(count("a") < 40, "the test meant to kill the daemon before its write-back, yet all files are there");
    assert_e2fsck_clean(&image);

    // Killed before the umount: the dead mount goes away and umount says what happened.
    let mut d = Daemon::start(&image, &dir, "commit=600", &[]);
    make_files("b");
    d.kill();
    let out = uext4().arg("umount").arg(&dir).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(1) && said.contains("no uext4 daemon served it"), "{out:?}");
    assert!(said.starts_with("uext4: umount: ") && !said.contains("invalid"), "not a usage error: {said}");
    assert!(!mounted(&dir), "the dead mount stays");
    assert_e2fsck_clean(&image);

    // A crash after `uext4 sync` leaves the image needing recovery: a read-only
    // mount replays the journal in memory only, changes nothing and unmounts
    // cleanly; a writable one recovers it.
    let mut d = Daemon::start(&image, &dir, "commit=600", &[]);
    make_files("r");
    run(uext4().arg("sync").arg(&dir));
    d.kill();
    assert_eq!(uext4().arg("umount").arg(&dir).output().unwrap().status.code(), Some(1));
    let before = fs::read(&image).unwrap();
    let m = UextMount::new(&image, "ro");
    let seen = fs::read_dir(&m.dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with('r'))
        .count();
    assert_eq!(seen, 40, "the read-only mount sees the journal's files");
    m.unmount();
    assert!(fs::read(&image).unwrap() == before, "a read-only mount changed the image");
    // The writable open that recovers says so, as the kernel's mount logs it.
    let out = uext4().arg("mkdir").arg(format!("{}:/after-recovery", image.display())).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.contains("its journal was recovered"), "{out:?}");
    assert_eq!(count("r"), 40);
    assert_e2fsck_clean(&image);

    // A daemon left alone: umount succeeds and every file is in the image.
    let mut d = Daemon::start(&image, &dir, "commit=600", &[]);
    make_files("c");
    run(uext4().arg("umount").arg(&dir));
    assert!(d.child.wait().unwrap().success(), "{}", d.stderr());
    assert_eq!(count("c"), 40);
    assert_e2fsck_clean(&image);
}

#[test]
fn a_panicking_request_gets_eio_and_the_mount_survives() {
    panicking_request(false);
}

#[test]
fn a_panicking_request_gets_eio_over_io_uring() {
    panicking_request(true);
}

/// The test hook makes the first WRITE request panic once it has been served:
/// its caller must get EIO at once (not hang), later changes EROFS, reads and
/// the unmount must still work, and the image must be clean.
fn panicking_request(uring: bool) {
    if !fuse_oracles() {
        return;
    }
    let Some(options) = transport(uring) else { return };
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("img");
    mkfs(&image, "64M");
    let m = UextMount::new(&image, options);
    fs::write(m.dir.join("kept"), "written before").unwrap();
    m.unmount();

    let dir = work.path().join("mnt");
    fs::create_dir(&dir).unwrap();
    let mut d = Daemon::start(&image, &dir, options, &[("UEXT4_TEST_PANIC_OPCODE", "16")]);
    fs::File::create(dir.join("victim")).unwrap();
    let target = dir.join("victim");
    let writer = std::thread::spawn(move || {
        let mut f = OpenOptions::new().append(true).open(target).unwrap();
        f.write_all(b"this write panics").and_then(|()| f.sync_all())
    });
    wait_until("the caller of the panicking request returns", 20, || writer.is_finished());
    let err = writer.join().unwrap().expect_err("the panicking write reported success");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");

    // Changes are refused from now on; reading goes on.
    let again = fs::write(dir.join("kept"), "overwrite");
    assert_eq!(again.unwrap_err().raw_os_error(), Some(libc::EROFS));
    assert_eq!(fs::create_dir(dir.join("newdir")).unwrap_err().raw_os_error(), Some(libc::EROFS));
    assert_eq!(fs::read_to_string(dir.join("kept")).unwrap(), "written before");
    assert!(fs::read_dir(&dir).unwrap().count() >= 3);
    assert_transport(&dir, uring, 0);

    // The unmount works, and says the session was not clean.
    let out = uext4().arg("umount").arg(&dir).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(1) && said.contains("panicked"), "{out:?}");
    assert!(!mounted(&dir));
    let status = d.child.wait().unwrap();
    let logged = d.stderr();
    assert!(!status.success(), "the daemon ends in failure after a panic: {logged}");
    assert!(logged.contains("(opcode 16)") && logged.contains("panicked") && logged.contains("test hook"), "{logged}");
    assert_e2fsck_clean(&image);
    assert_eq!(debugfs(&image, "cat /kept"), "written before");
}

#[test]
fn errors_panic_ends_the_session() {
    errors_panic(false);
}

#[test]
fn errors_panic_ends_the_session_over_io_uring() {
    errors_panic(true);
}

/// errors=panic through a mount: where the kernel's ext4 panics the machine,
/// the daemon ends the session at the first error. An inode-table block that
/// cannot be read (the test hook's bad sector) is met by a lookup: its caller
/// gets an error, the mount goes away, the daemon exits in failure saying why,
/// the superblock records the error, and a change made before the stop but not
/// yet committed never reaches the image (nothing is written after the stop,
/// as nothing is after a panic). Before, the session went on, read-only.
fn errors_panic(uring: bool) {
    if !fuse_oracles() {
        return;
    }
    let Some(transport) = transport(uring) else { return };
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("img");
    mkfs(&image, "64M");
    let m = UextMount::new(&image, transport);
    fs::create_dir(m.dir.join("far")).unwrap();
    for i in 0..32 {
        fs::write(m.dir.join("far").join(format!("f{i}")), "kept").unwrap();
    }
    m.unmount();
    let ino = |path: &str| debugfs(&image, &format!("stat {path}")).split_whitespace().nth(1).unwrap().to_string();
    let table_block = |ino: &str| {
        let at = debugfs(&image, &format!("imap <{ino}>"));
        at.split("located at block ").nth(1).unwrap().split(',').next().unwrap().trim().parse::<u64>().unwrap()
    };
    // The bad sector holds one of far's files and no inode the mount reads or
    // allocates before the lookup: not the root's, not far's, not the next free
    // ones (of the root's group, or after far's files).
    let last: u64 = ino("/far/f31").parse().unwrap();
    let avoid: Vec<u64> = ["2", "12", "13", &ino("/far"), &(last + 1).to_string(), &(last + 2).to_string()]
        .iter()
        .map(|i| table_block(i))
        .collect();
    let (victim_name, victim) = (0..32)
        .map(|i| format!("f{i}"))
        .map(|name| (name.clone(), table_block(&ino(&format!("/far/{name}")))))
        .find(|(_, block)| !avoid.contains(block))
        .expect("one of far's files has a table block of its own");

    let dir = work.path().join("mnt");
    fs::create_dir(&dir).unwrap();
    let bad = format!("{}:4096", victim * 4096);
    let options = format!("{transport},errors=panic,commit=600");
    let mut d = Daemon::start(&image, &dir, &options, &[("UEXT4_TEST_UNREADABLE", &bad)]);
    fs::write(dir.join("uncommitted"), "lost with the stop").unwrap();
    let met = fs::metadata(dir.join("far").join(&victim_name));
    assert!(met.is_err(), "the lookup through the bad sector succeeded");

    wait_until("the mount ends after the errors=panic stop", 20, || !mounted(&dir));
    wait_until("the daemon exits", 20, || d.child.try_wait().unwrap().is_some());
    let status = d.child.wait().unwrap();
    let logged = d.stderr();
    assert!(!status.success(), "the daemon ends in failure: {logged}");
    assert!(logged.contains("ending the session") && logged.contains("stopped by errors=panic"), "{logged}");
    assert!(!logged.contains("panicked"), "an errors=panic stop is not reported as a bug: {logged}");
    let state = debugfs(&image, "stats");
    assert!(state.contains("with errors") && state.contains("read_inode_from_table"), "{state}");
    assert!(!names_in_root(&image).iter().any(|n| n == "uncommitted"), "a change was written after the stop");
    assert_e2fsck_clean(&image);
}

#[test]
fn uext4_sync_makes_everything_durable_before_a_crash() {
    sync_then_crash(false, false);
}

#[test]
fn uext4_sync_makes_everything_durable_over_io_uring() {
    sync_then_crash(true, false);
}

/// With the kernel's write-back cache the files stay open, so their data is
/// still in the kernel's page cache when `uext4 sync` runs: its syncfs must
/// bring it to the daemon before the fsync commits.
#[test]
fn uext4_sync_makes_the_writeback_caches_data_durable() {
    sync_then_crash(true, true);
}

/// 200 files, `uext4 sync`, SIGKILL of the daemon: the kernel replays the
/// journal and finds all 200; e2fsck -fn is clean after the replay.
fn sync_then_crash(uring: bool, writeback_cache: bool) {
    if !fuse_oracles() {
        return;
    }
    let Some(options) = transport(uring) else { return };
    let options = with_writeback_cache(options, writeback_cache);
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("img");
    mkfs(&image, "64M");
    let dir = work.path().join("mnt");
    fs::create_dir(&dir).unwrap();
    let count_after_kernel_replay = |prefix: &str| {
        let k = KernelMount::new(&image, "");
        let n = fs::read_dir(&k.dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with(prefix))
            .count();
        for i in 0..n {
            let content = fs::read_to_string(k.dir.join(format!("{prefix}{i}"))).unwrap_or_default();
            assert_eq!(content, format!("content {i}"), "{prefix}{i} after the replay");
        }
        n
    };
    let crash_after = |prefix: &str, sync: &dyn Fn()| {
        let mut d = Daemon::start(&image, &dir, &format!("commit=600,{options}"), &[]);
        let mut open = Vec::new();
        for i in 0..200 {
            let mut f = fs::File::create(dir.join(format!("{prefix}{i}"))).unwrap();
            f.write_all(format!("content {i}").as_bytes()).unwrap();
            // Closing would write a file's pages back (FUSE's flush).
            if writeback_cache {
                open.push(f);
            }
        }
        assert_transport(&dir, uring, 0);
        assert_writeback_cache(&dir, writeback_cache);
        sync();
        d.kill();
        drop(open);
        let out = uext4().arg("umount").arg(&dir).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "umount of a killed daemon must fail: {out:?}");
        assert!(!mounted(&dir));
    };

    // What sync(2) gives on this kernel: Linux sends FUSE_SYNCFS to virtiofs only.
    crash_after("plain", &|| run(&mut Command::new("sync")).clear());
    let plain = count_after_kernel_replay("plain");
    eprintln!("sync(2) then a crash of the daemon: {plain} of 200 files survive");
    assert_e2fsck_clean(&image);

    crash_after("synced", &|| run(uext4().arg("sync").arg(&dir)).clear());
    assert_eq!(count_after_kernel_replay("synced"), 200, "files lost after uext4 sync and a crash");
    assert_e2fsck_clean(&image);
}

/// Runs `script` with sh as user and group 65534 (nobody).
fn as_nobody(script: &str) -> std::process::Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", script])
        .output()
        .expect("setpriv")
}

/// Mode, owner and group of each name, as `stat -c` shows them: GNU stat asks
/// statx for only the fields its format needs, so a mode the kernel still
/// caches shows here even where a full stat would refresh it.
fn modes(root: &Path, names: &[&str]) -> String {
    names
        .iter()
        .map(|n| {
            let out = Command::new("stat").args(["-c", "%a:%u:%g"]).arg(root.join(n)).output().unwrap();
            format!("{n}={}", String::from_utf8_lossy(&out.stdout).trim())
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn set(root: &Path, name: &str, mode: u32, uid: u32, gid: u32) {
    let p = root.join(name);
    std::os::unix::fs::lchown(&p, Some(uid), Some(gid)).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
}

/// Every attribute change of setuid/setgid objects a non-root user (and root)
/// can make, on the kernel's ext4 and through uext4's mount side by side: the
/// modes, owners and groups that `stat` shows right after each step must be
/// the same.
#[test]
fn privilege_bits_change_as_the_kernels_ext4_changes_them() {
    if !fuse_oracles() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (kimg, uimg) = (work.path().join("k.img"), work.path().join("u.img"));
    mkfs(&kimg, "64M");
    mkfs(&uimg, "64M");
    let k = KernelMount::new(&kimg, "");
    let u = UextMount::new(&uimg, "allow_other");
    for root in [&k.dir, &u.dir] {
        fs::set_permissions(root.parent().unwrap(), fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(root, fs::Permissions::from_mode(0o777)).unwrap();
    }
    const KINDS: [&str; 6] = ["file", "fifo", "chr", "blk", "sock", "dir"];
    let kinds = KINDS;
    for root in [&k.dir, &u.dir] {
        fs::write(root.join("file"), "x").unwrap();
        run(Command::new("mknod").arg(root.join("fifo")).arg("p"));
        run(Command::new("mknod").arg(root.join("chr")).args(["c", "1", "3"]));
        run(Command::new("mknod").arg(root.join("blk")).args(["b", "7", "200"]));
        drop(std::os::unix::net::UnixListener::bind(root.join("sock")).unwrap());
        fs::create_dir(root.join("dir")).unwrap();
    }
    let nobody = |cmd: String| {
        move |root: &Path| {
            let out = as_nobody(&cmd.replace("{}", &root.display().to_string()));
            format!("{}", out.status.code().unwrap_or(-1))
        }
    };
    type Step = (String, Box<dyn Fn(&Path)>, Box<dyn Fn(&Path) -> String>);
    let mut steps: Vec<Step> = Vec::new();
    for mode in [0o6755, 0o6745, 0o6555, 0o2745] {
        // The owner (nobody, in its own group) and root chown each kind to its own owner and group.
        steps.push((
            format!("nobody chowns {mode:o} objects it owns"),
            Box::new(move |r| kinds.iter().for_each(|n| set(r, n, mode, 65534, 65534))),
            Box::new(nobody(kinds.iter().map(|n| format!("chown 65534:65534 {{}}/{n}; ")).collect())),
        ));
        steps.push((
            format!("root chowns {mode:o} objects"),
            Box::new(move |r| kinds.iter().for_each(|n| set(r, n, mode, 65534, 65534))),
            Box::new(|r| {
                KINDS.iter().for_each(|n| std::os::unix::fs::lchown(r.join(n), Some(65534), Some(65534)).unwrap());
                "0".into()
            }),
        ));
        // Owned by nobody, group root (which nobody is not in).
        steps.push((
            format!("nobody chowns {mode:o} objects of a group it is not in"),
            Box::new(move |r| kinds.iter().for_each(|n| set(r, n, mode, 65534, 0))),
            Box::new(nobody(kinds.iter().map(|n| format!("chown 65534 {{}}/{n}; ")).collect())),
        ));
    }
    // A writer that does not own the file, and root, change its data.
    for (what, cmd) in [
        ("writes", "echo more >> {}/file"),
        ("truncates", "truncate -s 1 {}/file"),
        ("fallocates", "fallocate -l 65536 {}/file"),
        ("punches a hole", "fallocate -p -o 0 -l 4096 {}/file"),
        ("extends", "truncate -s 100000 {}/file"),
    ] {
        for (mode, gid) in [(0o6777, 0), (0o6767, 0), (0o2767, 0), (0o2777, 65534), (0o4777, 0)] {
            steps.push((
                format!("nobody {what} a {mode:o} file of group {gid}"),
                Box::new(move |r| set(r, "file", mode, 0, gid)),
                Box::new(nobody(cmd.to_string())),
            ));
        }
        steps.push((
            format!("root {what} a 6777 file"),
            Box::new(|r| set(r, "file", 0o6777, 65534, 65534)),
            Box::new(move |r| {
                run(Command::new("sh").arg("-c").arg(cmd.replace("{}", &r.display().to_string())));
                "0".into()
            }),
        ));
    }
    // chmod by the owner: setgid for a group it is not in is dropped by the kernel.
    for mode in ["2755", "6755", "4755", "g+s", "u+s"] {
        steps.push((
            format!("nobody chmods {mode} its file of group root"),
            Box::new(|r| set(r, "file", 0o755, 65534, 0)),
            Box::new(nobody(format!("chmod {mode} {{}}/file"))),
        ));
    }
    let mut differ = Vec::new();
    for (name, setup, step) in &steps {
        let mut seen = Vec::new();
        for root in [&k.dir, &u.dir] {
            setup(root);
            let status = step(root);
            // Right away: a stale attribute cache would show the old mode.
            seen.push(format!("exit {status}: {}", modes(root, &kinds)));
        }
        if seen[0] != seen[1] {
            differ.push(format!("{name}:\n  kernel {}\n  uext4  {}", seen[0], seen[1]));
        }
    }
    assert!(differ.is_empty(), "privilege bits differ from the kernel's ext4:\n{}", differ.join("\n"));
    drop(k);
    u.unmount();
    assert_e2fsck_clean(&uimg);
    assert_e2fsck_clean(&kimg);
}

/// Fills `dir/open/fill` as user nobody until the disk refuses, then writes 1 MiB
/// as root; returns (nobody's dd succeeded, root's dd succeeded).
fn fill_as_nobody_then_root(dir: &Path) -> (bool, bool) {
    let nobody = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "dd", "if=/dev/zero", "bs=1M"])
        .arg(format!("of={}", dir.join("open/fill").display()))
        .output()
        .expect("setpriv dd");
    let root = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "count=1", "conv=fsync"])
        .arg(format!("of={}", dir.join("rootfill").display()))
        .output()
        .expect("dd");
    (nobody.status.success(), root.status.success())
}

/// The reserved blocks (mkfs's 5%) are root's through the mount as on the
/// kernel's ext4: user nobody's writes stop short of them with ENOSPC, root's
/// go on into them. The two run side by side on twin images.
#[test]
fn reserved_blocks_are_roots_through_the_mount_as_on_the_kernel() {
    if !fuse_oracles() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (ours, theirs) = (work.path().join("ours"), work.path().join("theirs"));
    mkfs(&ours, "64M");
    fs::copy(&ours, &theirs).unwrap();
    let mut outcomes = Vec::new();
    {
        let m = UextMount::new(&ours, "allow_other,io_uring=off");
        fs::create_dir(m.dir.join("open")).unwrap();
        fs::set_permissions(m.dir.join("open"), fs::Permissions::from_mode(0o1777)).unwrap();
        outcomes.push(("uext4", fill_as_nobody_then_root(&m.dir)));
        m.unmount();
    }
    {
        let k = KernelMount::new(&theirs, "");
        fs::set_permissions(k.dir.parent().unwrap(), fs::Permissions::from_mode(0o755)).unwrap();
        fs::create_dir(k.dir.join("open")).unwrap();
        fs::set_permissions(k.dir.join("open"), fs::Permissions::from_mode(0o1777)).unwrap();
        outcomes.push(("kernel", fill_as_nobody_then_root(&k.dir)));
    }
    for (who, (nobody, root)) in &outcomes {
        assert!(!nobody, "{who}: user nobody must run out of space before the reserved blocks");
        assert!(root, "{who}: root must write into the reserved blocks");
    }
    assert_e2fsck_clean(&ours);
    assert_e2fsck_clean(&theirs);
}

/// A directory listed through the mount names every entry, also those whose
/// inode cannot be read (READDIRPLUS gives them without attributes); the
/// stat of such an entry fails. Leaving them out let `ls` and `cp -a` through
/// the mount end with exit 0 and files missing.
#[test]
fn a_listing_names_entries_whose_inode_cannot_be_read() {
    if !fuse_oracles() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let image = work.path().join("fs.img");
    mkfs(&image, "32M");
    let host = work.path().join("src");
    fs::create_dir(&host).unwrap();
    for i in 0..40 {
        fs::write(host.join(format!("f{i:02}")), format!("file {i}")).unwrap();
    }
    run(uext4().arg("cp").arg("-r").arg(&host).arg(format!("{}:/d", image.display())));
    // Two inodes fail their checksum (as a bad read would leave them unreadable).
    let damaged = ["f07", "f31"];
    for name in damaged {
        debugfs_write(&image, &format!("sif /d/{name} checksum 0x1234"));
    }
    let m = UextMount::new(&image, "");
    let mut names: Vec<String> =
        fs::read_dir(m.dir.join("d")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names.len(), 40, "every name is listed: {names:?}");
    for name in damaged {
        assert!(fs::metadata(m.dir.join("d").join(name)).is_err(), "{name} cannot be stat'ed");
    }
    assert_eq!(fs::read_to_string(m.dir.join("d/f08")).unwrap(), "file 8");
    let ls = Command::new("ls").arg("-l").arg(m.dir.join("d")).output().unwrap();
    assert!(!ls.status.success(), "ls -l reports the unreadable entries: {ls:?}");
    m.unmount();
}

fn debugfs_write(image: &Path, request: &str) {
    let out = Command::new("debugfs").arg("-w").arg("-R").arg(request).arg(image).output().unwrap();
    assert!(out.status.success(), "debugfs -w -R {request}: {out:?}");
}

/// `uext4 umount` finds the daemon by the mount, not by the image path: an image
/// renamed while mounted unmounts cleanly (it said the daemon had crashed, and
/// with another mounted image moved onto the name it hung); of two mounts stacked
/// on one directory it takes the top one, as umount(2) does (it took the top and
/// then waited forever for the covered one's daemon); and a filesystem that is
/// not uext4's, mounted over a uext4 mount, is refused by name, not unmounted.
#[test]
fn umount_follows_the_mount_not_the_image_path() {
    if !fuse_oracles() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let (a, b) = (work.path().join("a.img"), work.path().join("b.img"));
    mkfs(&a, "64M");
    mkfs(&b, "64M");
    let dir = work.path().join("m");
    fs::create_dir(&dir).unwrap();
    let mount = |image: &Path| run(uext4().arg("mount").arg(image).arg(&dir));
    let umount = || uext4().arg("umount").arg(&dir).output().unwrap();

    // Renamed while mounted.
    mount(&a);
    fs::write(dir.join("file"), b"hello").unwrap();
    let renamed = work.path().join("renamed.img");
    fs::rename(&a, &renamed).unwrap();
    let out = umount();
    assert!(out.status.success(), "umount after a rename: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no longer names the image"));
    assert!(!mounted(&dir));
    assert_eq!(run(uext4().arg("cat").arg(format!("{}:/file", renamed.display()))), "hello");
    assert_e2fsck_clean(&renamed);

    // Two uext4 mounts stacked: the top one goes, the covered one stays and serves.
    mount(&renamed);
    mount(&b);
    fs::write(dir.join("on-b"), b"b").unwrap();
    let out = umount();
    assert!(out.status.success(), "umount of the top mount: {}", String::from_utf8_lossy(&out.stderr));
    assert!(dir.join("file").exists() && !dir.join("on-b").exists(), "the covered mount should show again");
    assert_eq!(run(uext4().arg("cat").arg(format!("{}:/on-b", b.display()))), "b");

    // A tmpfs over the uext4 mount: refused, and both stay.
    run(Command::new("mount").args(["-t", "tmpfs", "tmpfs"]).arg(&dir));
    let out = umount();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is tmpfs"), "{}", String::from_utf8_lossy(&out.stderr));
    run(Command::new("umount").arg(&dir));
    let out = umount();
    assert!(out.status.success(), "umount after the tmpfs went: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!mounted(&dir));
    assert_e2fsck_clean(&renamed);
    assert_e2fsck_clean(&b);
}
