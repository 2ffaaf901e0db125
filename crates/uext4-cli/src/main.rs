//! `uext4`: the command-line face of the uext4 engine.
//!
//! Every subcommand names files inside an image as `IMAGE:/path` (as e2tools' e2cp
//! does). Exit status is 0 on success and 1 with a message on stderr (one line per
//! refused operand), every byte from an image in it escaped (see `show`).

mod cmd_cp;
mod cmd_edit;
mod cmd_info;
mod cmd_ls;
mod cmd_mkfs;
mod cmd_mount;
mod cmd_put;
mod cmd_stats;
mod demo;
mod fuse;
mod put_parallel;
mod show;
mod target;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "uext4", version, about = "Read, write and inspect ext4 images in user space")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the superblock and feature summary, like `dumpe2fs -h`
    Info(cmd_info::InfoArgs),
    /// List a directory inside an image
    Ls(cmd_ls::LsArgs),
    /// Write a file's contents from an image to standard output
    Cat(cmd_ls::CatArgs),
    /// Show an inode's fields, its block mapping (extents, block map or inline) and xattrs
    Stat(cmd_ls::StatArgs),
    /// Copy files out of an image (cp -r IMAGE:/path HOSTDIR) or into it (cp -r HOSTPATH... IMAGE:/path)
    Cp(cmd_cp::CpArgs),
    /// Histograms of directory and file sizes, and how many would fit inline
    Stats(cmd_stats::StatsArgs),
    /// Create a new ext4 image
    Mkfs(cmd_mkfs::MkfsArgs),
    /// Make directories inside an image
    Mkdir(cmd_edit::MkdirArgs),
    /// Remove files (and with -r, directories) inside an image
    Rm(cmd_edit::RmArgs),
    /// Rename or move inside an image
    Mv(cmd_edit::MvArgs),
    /// Make a hard link, or with -s a symbolic link, inside an image
    Ln(cmd_edit::LnArgs),
    /// Set a file's size
    Truncate(cmd_edit::TruncateArgs),
    /// Change permission bits (octal)
    Chmod(cmd_edit::ChmodArgs),
    /// Change owner (numeric UID[:GID])
    Chown(cmd_edit::ChownArgs),
    /// Set (-n NAME -v VALUE) or remove (-x NAME) an extended attribute
    Setfattr(cmd_edit::SetfattrArgs),
    /// Show extended attributes
    Getfattr(cmd_edit::GetfattrArgs),
    /// Build a fresh image in a temporary directory, fill it, check it with e2fsck
    Demo(demo::DemoArgs),
    /// Mount an image through FUSE (multi-threaded; detaches unless --foreground)
    Mount(cmd_mount::MountArgs),
    /// Unmount a uext4 mount, waiting until everything is written back
    Umount(cmd_mount::UmountArgs),
    /// Commit everything written through a uext4 mount (sync(2) does not reach FUSE servers)
    Sync(cmd_mount::SyncArgs),
    /// Show the tunables of a uext4 mount, or change the runtime ones (key=value)
    Tune(cmd_mount::TuneArgs),
    /// Run workloads side by side on uext4, the kernel's ext4 and fuse2fs (`bench list` shows them)
    Bench(uext4_bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result: show::CliResult<()> = match cli.command {
        Command::Info(a) => cmd_info::run(a),
        Command::Ls(a) => cmd_ls::run_ls(a),
        Command::Cat(a) => cmd_ls::run_cat(a),
        Command::Stat(a) => cmd_ls::run_stat(a),
        Command::Cp(a) => cmd_cp::run(a),
        Command::Stats(a) => cmd_stats::run(a).map_err(Into::into),
        Command::Mkfs(a) => cmd_mkfs::run(a).map_err(Into::into),
        Command::Mkdir(a) => cmd_edit::mkdir(a),
        Command::Rm(a) => cmd_edit::rm(a),
        Command::Mv(a) => cmd_edit::mv(a),
        Command::Ln(a) => cmd_edit::ln(a),
        Command::Truncate(a) => cmd_edit::truncate(a),
        Command::Chmod(a) => cmd_edit::chmod(a),
        Command::Chown(a) => cmd_edit::chown(a),
        Command::Setfattr(a) => cmd_edit::setfattr(a),
        Command::Getfattr(a) => cmd_edit::getfattr(a),
        Command::Demo(a) => demo::run(a).map_err(Into::into),
        Command::Mount(a) => cmd_mount::mount(a).map_err(Into::into),
        Command::Umount(a) => cmd_mount::umount(a).map_err(Into::into),
        Command::Sync(a) => cmd_mount::sync(a).map_err(Into::into),
        Command::Tune(a) => cmd_mount::tune(a).map_err(Into::into),
        Command::Bench(a) => uext4_bench::run(&a).map_err(|e| show::Failure::from(uext4::Error::Invalid(e.0))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if e.to_string().contains("Broken pipe") {
                return ExitCode::SUCCESS;
            }
            for line in &e.lines {
                eprintln!("uext4: {}", show::escape(line.as_bytes()));
            }
            ExitCode::from(1)
        }
    }
}
