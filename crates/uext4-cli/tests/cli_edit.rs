//! The small editing commands (mkdir, rm, mv, ln, truncate, chmod, chown,
//! setfattr, getfattr), each followed by e2fsck -fn; the kernel checks the end result.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

fn uext4(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_uext4")).args(args).output().unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = uext4(args);
    assert!(out.status.success(), "uext4 {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn e2fsck_clean(image: &Path) {
    let out = Command::new("e2fsck").arg("-fn").arg(image).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && text.lines().all(|l| l.starts_with("Pass ") || l.contains(" files (") || l.trim().is_empty()),
        "{text}"
    );
}

#[test]
fn editing_commands() {
    let have_root = unsafe { libc::geteuid() } == 0;
    if !have_root {
        assert!(std::env::var("UEXT4_REQUIRE_ORACLES").as_deref() != Ok("1"), "needs root for the kernel check");
        eprintln!("SKIPPED: needs root for the kernel check");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("fs.img");
    let i = img.to_str().unwrap();
    let at = |p: &str| format!("{i}:{p}");
    ok(&["mkfs", "-q", i, "--size", "64M"]);
    let host = dir.path().join("f.txt");
    std::fs::write(&host, vec![b'x'; 10_000]).unwrap();
    let steps: Vec<Vec<String>> = vec![
        vec!["mkdir".into(), "-p".into(), at("/a/b/c")],
        vec!["mkdir".into(), "-p".into(), at("/a/b/c")],
        vec!["cp".into(), host.display().to_string(), at("/a/b/c")],
        vec!["ln".into(), at("/a/b/c/f.txt"), at("/hard")],
        vec!["ln".into(), "-s".into(), "a/b/c/f.txt".into(), at("/soft")],
        vec!["mv".into(), at("/a/b/c"), at("/moved")],
        vec!["chmod".into(), "640".into(), at("/hard")],
        vec!["chown".into(), "1234:5678".into(), at("/hard")],
        vec!["truncate".into(), "-s".into(), "100".into(), at("/hard")],
        vec!["setfattr".into(), "-n".into(), "user.note".into(), "-v".into(), "hello".into(), at("/hard")],
        vec!["mkdir".into(), at("/gone")],
        vec!["cp".into(), host.display().to_string(), at("/gone")],
        vec!["rm".into(), "-r".into(), at("/gone")],
        vec!["rm".into(), "-f".into(), at("/never-was")],
    ];
    for step in &steps {
        let args: Vec<&str> = step.iter().map(|s| s.as_str()).collect();
        ok(&args);
        e2fsck_clean(&img);
    }
    assert!(ok(&["getfattr", &at("/hard")]).contains("user.note=\"hello\""));
    let err = uext4(&["rm", &at("/a")]);
    assert_eq!(err.status.code(), Some(1), "rm of a directory without -r");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    assert!(Command::new("mount").args(["-o", "ro,loop"]).arg(&img).arg(&mnt).status().unwrap().success());
    let check = || {
        let m = std::fs::metadata(mnt.join("moved/f.txt")).unwrap();
        assert_eq!((m.len(), m.mode() & 0o7777, m.uid(), m.gid(), m.nlink()), (100, 0o640, 1234, 5678, 2));
        assert_eq!(std::fs::read_link(mnt.join("soft")).unwrap(), Path::new("a/b/c/f.txt"));
        assert!(mnt.join("a/b").is_dir() && !mnt.join("a/b/c").exists() && !mnt.join("gone").exists());
    };
    let result = std::panic::catch_unwind(check);
    Command::new("umount").arg(&mnt).status().unwrap();
    result.unwrap();
}

/// `rm -r IMAGE:/dir` removes a big tree through the library's remove_tree: the
/// kernel makes it (an htree directory, subdirectories, a hard link to a file
/// outside), uext4 removes it, e2fsck is silent and the kernel finds the rest
/// as it was; the root, '.' and '..' are refused and leave the image alone.
#[test]
fn rm_r_removes_a_big_tree() {
    let have_root = unsafe { libc::geteuid() } == 0;
    if !have_root {
        assert!(std::env::var("UEXT4_REQUIRE_ORACLES").as_deref() != Ok("1"), "needs root for the kernel");
        eprintln!("SKIPPED: needs root for the kernel");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("fs.img");
    let i = img.to_str().unwrap();
    let at = |p: &str| format!("{i}:{p}");
    ok(&["mkfs", "-q", i, "--size", "64M"]);
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mount = |opts: &str| {
        let status = Command::new("mount").args(["-o", opts]).arg(&img).arg(&mnt).status().unwrap();
        assert!(status.success(), "mount -o {opts}");
    };
    let umount = || {
        for _ in 0..100 {
            if Command::new("umount").arg(&mnt).status().unwrap().success() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("cannot unmount {}", mnt.display());
    };
    mount("loop");
    let made = std::panic::catch_unwind(|| {
        std::fs::write(mnt.join("outside"), b"kept").unwrap();
        std::fs::create_dir_all(mnt.join("t/many")).unwrap();
        for n in 0..4_000 {
            std::fs::write(mnt.join(format!("t/many/file-{n:05}")), b"").unwrap();
        }
        for d in 0..20 {
            let sub = mnt.join(format!("t/sub{d}/inner"));
            std::fs::create_dir_all(&sub).unwrap();
            std::fs::write(sub.join("data"), vec![d as u8; 20_000]).unwrap();
        }
        std::fs::hard_link(mnt.join("outside"), mnt.join("t/link")).unwrap();
    });
    umount();
    made.unwrap();
    let listing = ok(&["ls", &at("/t")]);
    for refused in ["/", "/.", "/t/.."] {
        let out = uext4(&["rm", "-r", &at(refused)]);
        assert_eq!(out.status.code(), Some(1), "rm -r {refused} was not refused");
    }
    assert_eq!(ok(&["ls", &at("/t")]), listing, "a refused rm changed the tree");
    let out = uext4(&["rm", "-r", &at("/t")]);
    assert!(out.status.success(), "rm -r: {}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.stderr.is_empty(),
        "progress on a stderr that is not a terminal: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    e2fsck_clean(&img);
    mount("ro,loop");
    let check = std::panic::catch_unwind(|| {
        assert!(!mnt.join("t").exists());
        let m = std::fs::metadata(mnt.join("outside")).unwrap();
        assert_eq!((m.nlink(), std::fs::read(mnt.join("outside")).unwrap()), (1, b"kept".to_vec()));
    });
    umount();
    check.unwrap();
}
