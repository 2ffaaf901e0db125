//! The `uext4` binary as a user meets it: help, exit codes, reading commands
//! checked against dumpe2fs and the host tree an image was built from, and
//! extraction from hostile images that try to write outside the target.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn uext4(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_uext4")).args(args).output().expect("run uext4")
}

fn ok(args: &[&str]) -> String {
    let out = uext4(args);
    assert!(out.status.success(), "uext4 {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Fails with exit 1 and one "uext4: ..." line on stderr; returns that line.
fn fails(args: &[&str]) -> String {
    let out = uext4(args);
    assert_eq!(out.status.code(), Some(1), "uext4 {args:?} should fail: {}", String::from_utf8_lossy(&out.stdout));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(err.lines().count(), 1, "one line on stderr: {err}");
    assert!(err.starts_with("uext4: "), "{err}");
    err
}

fn have(tool: &str) -> bool {
    Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().map(|o| o.status.success()).unwrap_or(false)
}

fn require_e2fsprogs() -> bool {
    if have("mkfs.ext4") && have("debugfs") {
        return true;
    }
    assert!(std::env::var("UEXT4_REQUIRE_ORACLES").as_deref() != Ok("1"), "e2fsprogs is required");
    eprintln!("SKIPPED: e2fsprogs is not installed");
    false
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Builds an image from a host tree with mkfs.ext4 -d.
fn image_from(tree: &Path, image: &Path, extra: &[&str]) {
    run(Command::new("mkfs.ext4").args(["-q", "-F"]).args(extra).arg("-d").arg(tree).arg(image).arg("32M"));
}

fn sample_tree(root: &Path) {
    fs::create_dir_all(root.join("dir/sub")).unwrap();
    fs::write(root.join("hello.txt"), b"hello, world\n").unwrap();
    fs::write(root.join("dir/sub/data.bin"), (0..100_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>()).unwrap();
    let sparse = fs::File::create(root.join("sparse")).unwrap();
    sparse.set_len(5 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&sparse, b"x", 3 << 20).unwrap();
    fs::set_permissions(root.join("hello.txt"), fs::Permissions::from_mode(0o4751)).unwrap();
    std::os::unix::fs::symlink("dir/sub/data.bin", root.join("link")).unwrap();
    fs::hard_link(root.join("hello.txt"), root.join("dir/hardlink")).unwrap();
    for i in 0..300 {
        fs::write(root.join(format!("dir/f{i:03}")), format!("{i}")).unwrap();
    }
}

#[test]
fn every_subcommand_has_help() {
    for sub in [
        "info", "ls", "cat", "stat", "cp", "stats", "mkfs", "demo", "mkdir", "rm", "mv", "ln", "truncate", "chmod",
        "chown", "setfattr", "getfattr",
    ] {
        let out = ok(&[sub, "--help"]);
        assert!(out.contains("Usage: uext4 ") && out.contains(sub), "{sub} --help: {out}");
    }
    assert!(ok(&["--help"]).contains("Commands:"));
}

#[test]
fn errors_are_one_line_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.img");
    let m = missing.to_str().unwrap();
    assert!(fails(&["info", m]).contains("missing.img"));
    let junk = dir.path().join("junk.img");
    fs::write(&junk, vec![0u8; 1 << 20]).unwrap();
    assert!(fails(&["ls", &format!("{}:/", junk.display())]).contains("magic"));
    assert!(fails(&["mkfs", dir.path().join("t.img").to_str().unwrap(), "--size", "1M"]).contains("outside"));
    if require_e2fsprogs() {
        let tree = dir.path().join("tree");
        sample_tree(&tree);
        let image = dir.path().join("fs.img");
        image_from(&tree, &image, &[]);
        let i = image.to_str().unwrap();
        // GNU's words: the command, the operand, the errno text.
        let missing = fails(&["cat", &format!("{i}:/no/such/file")]);
        assert!(
            missing.contains(&format!("cat: cannot access '{i}:/no/such/file': No such file or directory")),
            "{missing}"
        );
        assert!(fails(&["cat", &format!("{i}:/dir")]).contains("Is a directory"));
        assert!(fails(&["ls", &format!("{i}:/hello.txt/x")]).contains("Not a directory"));
    }
}

#[test]
fn info_matches_dumpe2fs_and_reading_commands_match_the_source() {
    if !require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    sample_tree(&tree);
    let image = dir.path().join("fs.img");
    image_from(&tree, &image, &["-L", "clitest"]);
    let i = image.to_str().unwrap();
    let info = ok(&["info", i]);
    let dump = run(Command::new("dumpe2fs").arg("-h").arg(&image));
    for field in [
        "Filesystem UUID",
        "Filesystem features",
        "Inode count",
        "Block count",
        "Free blocks",
        "Free inodes",
        "Journal features",
        "Total journal blocks",
        "Journal sequence",
        "Journal start",
    ] {
        let pick = |text: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("{field}:")))
                .map(|l| l.split_once(':').unwrap().1.trim().to_string())
        };
        assert_eq!(pick(&info), pick(&dump), "{field}");
        assert!(pick(&info).is_some(), "{field} missing from uext4 info");
    }
    assert!(info.contains("clitest"));

    let ls = ok(&["ls", &format!("{i}:/dir")]);
    assert_eq!(ls.lines().filter(|l| l.starts_with('f')).count(), 300);
    let long = ok(&["ls", "-l", &format!("{i}:/")]);
    assert!(long.lines().any(|l| l.starts_with("-rwsr-x--x") && l.ends_with("hello.txt")), "{long}");
    assert!(long.lines().any(|l| l.starts_with('l') && l.ends_with("link -> dir/sub/data.bin")), "{long}");
    let cat = uext4(&["cat", &format!("{i}:/dir/sub/data.bin")]);
    assert_eq!(cat.stdout, fs::read(tree.join("dir/sub/data.bin")).unwrap());
    let stat = ok(&["stat", &format!("{i}:/sparse")]);
    assert!(stat.contains("Size: 5242880") && stat.contains("Extents:") && stat.contains("hole"), "{stat}");
    let stats = ok(&["stats", i]);
    assert!(
        stats.contains("directory size (entries") && stats.contains("file size (bytes)") && stats.contains("count="),
        "{stats}"
    );
    assert!(stats.contains("files that would fit inline"), "{stats}");
}

/// An image with an error recorded (as the kernel's ext4_error leaves it) shows
/// it in `uext4 info` as dumpe2fs -h shows it; it said "clean".
#[test]
fn info_shows_a_recorded_error_as_dumpe2fs_does() {
    if !require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    run(Command::new("mkfs.ext4").args(["-F", "-q"]).arg(&image).arg("32M"));
    for set in [
        "state 3",
        "errors 2",
        "error_count 2",
        "first_error_time 1700000000",
        "first_error_func ext4_lookup",
        "first_error_ino 12",
    ] {
        run(Command::new("debugfs").arg("-w").arg("-R").arg(format!("ssv {set}")).arg(&image));
    }
    // debugfs cannot set the error code: the byte (s_first_error_errcode, 0x27A
    // into the superblock) goes in by hand, EFSCORRUPTED, and debugfs then
    // writes the superblock again with its checksum redone.
    {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new().write(true).open(&image).unwrap();
        file.write_all_at(&[5], 1024 + 0x27A).unwrap();
    }
    run(Command::new("debugfs").args(["-w", "-n", "-R", "ssv first_error_line 7"]).arg(&image));
    let info = ok(&["info", image.to_str().unwrap()]);
    let dump = run(Command::new("dumpe2fs").arg("-h").arg(&image));
    for field in [
        "Filesystem state",
        "Errors behavior",
        "FS Error count",
        "First error function",
        "First error inode #",
        "First error err",
    ] {
        let pick = |text: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("{field}:")))
                .map(|l| l.split_once(':').unwrap().1.trim().to_string())
        };
        assert_eq!(pick(&info), pick(&dump), "{field}");
        assert!(pick(&info).is_some(), "{field} is shown");
    }
    // dumpe2fs leaves out what is not set (the block here); so does info.
    assert!(!info.contains("First error block #"), "{info}");
}

/// Walks two host trees and asserts they agree in names, types, modes, sizes,
/// mtimes, contents, symlink targets and hard-link structure.
fn assert_same_tree(a: &Path, b: &Path) {
    let mut stack = vec![PathBuf::new()];
    let mut inodes_a = std::collections::HashMap::new();
    while let Some(rel) = stack.pop() {
        let (pa, pb) = (a.join(&rel), b.join(&rel));
        let (ma, mb) = (fs::symlink_metadata(&pa).unwrap(), fs::symlink_metadata(&pb).unwrap());
        assert_eq!(ma.file_type(), mb.file_type(), "{rel:?}");
        // The target root is the user's own directory: cp does not restamp it.
        if !ma.file_type().is_symlink() && rel != Path::new("") {
            assert_eq!(ma.mode(), mb.mode(), "mode of {rel:?}");
            // mkfs.ext4 -d stores whole seconds only; nanoseconds are checked against debugfs.
            assert_eq!(ma.mtime(), mb.mtime(), "mtime of {rel:?}");
        }
        if ma.is_dir() {
            let mut names: Vec<_> = fs::read_dir(&pa).unwrap().map(|e| e.unwrap().file_name()).collect();
            let mut names_b: Vec<_> = fs::read_dir(&pb).unwrap().map(|e| e.unwrap().file_name()).collect();
            names.sort();
            names_b.sort();
            assert_eq!(names, names_b, "listing of {rel:?}");
            stack.extend(names.into_iter().map(|n| rel.join(n)));
        } else if ma.file_type().is_symlink() {
            assert_eq!(fs::read_link(&pa).unwrap(), fs::read_link(&pb).unwrap());
        } else {
            assert_eq!(fs::read(&pa).unwrap(), fs::read(&pb).unwrap(), "contents of {rel:?}");
            assert_eq!(ma.nlink(), mb.nlink(), "links of {rel:?}");
            // Files sharing an inode in the source share one in the copy.
            if let Some(other) = inodes_a.insert(ma.ino(), mb.ino()) {
                assert_eq!(other, mb.ino(), "hard link {rel:?}");
            }
        }
    }
}

#[test]
fn cp_r_extracts_an_identical_tree() {
    if !require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    sample_tree(&tree);
    let image = dir.path().join("fs.img");
    image_from(&tree, &image, &[]);
    let out = dir.path().join("out");
    fs::create_dir(&out).unwrap();
    ok(&["cp", "-r", &format!("{}:/", image.display()), out.to_str().unwrap()]);
    fs::remove_dir(out.join("lost+found")).unwrap();
    assert_same_tree(&tree, &out);
    // Nanoseconds as the image holds them (debugfs prints mtime as 0xSECONDS:EXTRA).
    let stat = run(Command::new("debugfs").arg("-R").arg("stat /hello.txt").arg(&image));
    let extra = stat.lines().find_map(|l| l.trim().strip_prefix("mtime: 0x")).unwrap();
    let extra = u32::from_str_radix(&extra[9..17], 16).unwrap();
    assert_eq!(fs::symlink_metadata(out.join("hello.txt")).unwrap().mtime_nsec(), (extra >> 2) as i64);
    // The sparse file stayed sparse on the host.
    let sparse = fs::metadata(out.join("sparse")).unwrap();
    assert!(sparse.blocks() * 512 < 1 << 20, "{} bytes allocated", sparse.blocks() * 512);
    // A subdirectory into an existing directory lands under its own name.
    let out2 = dir.path().join("out2");
    fs::create_dir(&out2).unwrap();
    ok(&["cp", "-r", &format!("{}:/dir/sub", image.display()), out2.to_str().unwrap()]);
    assert_eq!(fs::read(out2.join("sub/data.bin")).unwrap(), fs::read(tree.join("dir/sub/data.bin")).unwrap());
    // Without -r a directory is refused.
    assert!(fails(&["cp", &format!("{}:/dir", image.display()), dir.path().join("x").to_str().unwrap()]).contains("-r"));
}

/// Replaces `from` with `to` (same length) in the directory block(s) of `dir` in an
/// image without metadata checksums, so the entry's name becomes hostile.
fn rename_entry_on_disk(image: &Path, dir: &str, from: &[u8], to: &[u8]) {
    assert_eq!(from.len(), to.len());
    let blocks = run(Command::new("debugfs").arg("-R").arg(format!("blocks {dir}")).arg(image));
    let bs: u64 = 1024;
    let mut data = fs::read(image).unwrap();
    let mut done = false;
    for b in blocks.split_whitespace() {
        let b: u64 = b.parse().unwrap();
        let block = &mut data[(b * bs) as usize..((b + 1) * bs) as usize];
        if let Some(pos) = block.windows(from.len()).position(|w| w == from) {
            block[pos..pos + to.len()].copy_from_slice(to);
            done = true;
        }
    }
    assert!(done, "{from:?} not found in {dir}");
    fs::write(image, data).unwrap();
}

fn assert_nothing_outside(base: &Path, allowed: &[&str]) {
    let mut names: Vec<String> =
        fs::read_dir(base).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    let mut allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
    allowed.sort();
    assert_eq!(names, allowed, "something was written outside the target");
}

#[test]
fn hostile_names_are_refused_and_nothing_lands_outside() {
    if !require_e2fsprogs() {
        return;
    }
    for (from, to, what) in [
        (&b"aXb"[..], &b"a/b"[..], "slash"),
        (&b"zz"[..], &b".."[..], "dotdot"),
        (&b"q"[..], &b"."[..], "dot"),
        (&b"nul"[..], &b"n\0l"[..], "nul"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        fs::create_dir_all(tree.join("d")).unwrap();
        let name = std::str::from_utf8(from).unwrap();
        fs::create_dir(tree.join("d").join(name)).unwrap();
        fs::write(tree.join("d").join(name).join("payload"), b"escaped").unwrap();
        let image = dir.path().join("fs.img");
        image_from(&tree, &image, &["-b", "1024", "-O", "^metadata_csum"]);
        rename_entry_on_disk(&image, "/d", from, to);
        let out = dir.path().join("out");
        fs::create_dir(&out).unwrap();
        let result = uext4(&["cp", "-r", &format!("{}:/", image.display()), out.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&result.stderr);
        assert_eq!(result.status.code(), Some(1), "{what}: {err}");
        assert!(err.contains("unsafe file name"), "{what}: {err}");
        assert_nothing_outside(dir.path(), &["tree", "fs.img", "out"]);
        assert!(!out.join("payload").exists() && !dir.path().join("payload").exists(), "{what}");
    }
}

#[test]
fn existing_symlinks_in_the_target_are_not_followed() {
    if !require_e2fsprogs() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    fs::create_dir_all(tree.join("etc")).unwrap();
    fs::write(tree.join("etc/passwd"), b"owned").unwrap();
    fs::write(tree.join("file"), b"data").unwrap();
    let image = dir.path().join("fs.img");
    image_from(&tree, &image, &[]);
    let outside = dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    let out = dir.path().join("out");
    fs::create_dir(&out).unwrap();
    std::os::unix::fs::symlink(&outside, out.join("etc")).unwrap();
    std::os::unix::fs::symlink(outside.join("file"), out.join("file")).unwrap();
    // Each is refused by name, and the copy goes on with the rest (GNU cp -r's way), exit 1.
    let result = uext4(&["cp", "-r", &format!("{}:/", image.display()), out.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&result.stderr);
    assert_eq!(result.status.code(), Some(1), "{err}");
    for name in ["out/etc", "out/file"] {
        assert!(err.lines().any(|l| l.contains(name) && l.contains("exists")), "{name} not refused: {err}");
    }
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0, "a symlink in the target was followed");
}
