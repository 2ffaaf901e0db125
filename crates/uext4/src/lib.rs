//! uext4: an ext4 filesystem engine in user space.
//!
//! Open an ext4 image (a file, a block device, a partition of a disk image, or
//! any [`BlockDevice`]) as a [`Filesystem`], and read and change it the way the
//! kernel's ext4 would: what uext4 writes passes `e2fsck -fn` and mounts in
//! Linux. Every operation takes `&self`; a `Filesystem` is `Send + Sync` and may
//! be used from many threads at once. Files are named by inode number (the root
//! is [`ROOT_INO`]) and names are bytes, as in ext4 itself; [`Filesystem::lookup_path`]
//! turns a path into an inode number.
//!
//! The public surface: [`Filesystem`] and its [`Options`]; the operations on
//! `Filesystem` (lookup, [`stat`](Filesystem::stat), [`read_dir`](Filesystem::read_dir),
//! [`read`](Filesystem::read), [`write`](Filesystem::write), [`create`](Filesystem::create),
//! [`mkdir`](Filesystem::mkdir), [`unlink`](Filesystem::unlink),
//! [`rename`](Filesystem::rename), [`setattr`](Filesystem::setattr), xattrs,
//! [`fallocate`](Filesystem::fallocate), [`sync`](Filesystem::sync)...); the
//! values they return ([`Stat`], [`FileType`], [`DirEntry`], [`StatFs`]); the one
//! error type [`Error`], whose variants are the kernel's errnos; the device
//! trait [`BlockDevice`] with [`FileDevice`], [`MemDevice`] and [`BoundedDevice`];
//! [`mkfs`] to make new filesystems; and [`clock`] for reproducible times.
//! Other modules are public only for uext4's own tests, benchmarks and fuzzer,
//! are hidden from this documentation and may change at any time.
//!
//! # Examples
//!
//! Make a filesystem in memory, then create, write and read a file and list the
//! root:
//!
//! ```
//! use std::sync::Arc;
//! use uext4::mkfs::{make, MkfsOptions};
//! use uext4::{Filesystem, MemDevice, Options, Owner, ROOT_INO};
//!
//! # fn main() -> uext4::Result<()> {
//! let opts = MkfsOptions { size: 16 << 20, ..MkfsOptions::default() };
//! let dev = MemDevice::new(vec![0; opts.size as usize]);
//! make(&dev, &opts, true)?;
//!
//! let fs = Filesystem::open_device(Arc::new(dev), Options { read_only: false, ..Options::default() })?;
//! let owner = Owner { uid: 1000, gid: 1000 };
//! let docs = fs.mkdir(ROOT_INO, b"docs", 0o755, owner)?;
//! let file = fs.create(docs.ino, b"hello.txt", 0o644, owner)?;
//! fs.write(file.ino, 0, b"hello, ext4\n")?;
//!
//! assert_eq!(fs.lookup_path(b"/docs/hello.txt")?, file.ino);
//! assert_eq!(fs.read_all(file.ino)?, b"hello, ext4\n");
//! let names: Vec<Vec<u8>> = fs.read_dir(ROOT_INO)?.into_iter().map(|e| e.name).collect();
//! assert!(names.contains(&b"docs".to_vec()) && names.contains(&b"lost+found".to_vec()));
//! fs.sync()?;
//! # Ok(())
//! # }
//! ```
//!
//! Open an image file read-only and list a directory (here one made by
//! [`mkfs::mkfs`] in a temporary directory):
//!
//! ```
//! use uext4::{Filesystem, Options};
//!
//! # fn main() -> uext4::Result<()> {
//! # let dir = std::env::temp_dir().join(format!("uext4-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir)?;
//! # let image = dir.join("image.ext4");
//! # uext4::mkfs::mkfs(&image, &uext4::mkfs::MkfsOptions { size: 8 << 20, ..Default::default() })?;
//! let fs = Filesystem::open(&image, Options::default())?; // read-only by default
//! let root = fs.lookup_path(b"/")?;
//! for entry in fs.read_dir(root)? {
//!     let st = fs.stat(entry.ino)?;
//!     println!("{:>10} {}", st.size, String::from_utf8_lossy(&entry.name));
//! }
//! # drop(fs);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(())
//! # }
//! ```
//!
//! Errors are [`Error`] values carrying the errno the kernel would give:
//!
//! ```
//! # use std::sync::Arc;
//! # use uext4::{Filesystem, MemDevice, Options, Error, ROOT_INO};
//! # fn main() -> uext4::Result<()> {
//! # let opts = uext4::mkfs::MkfsOptions { size: 16 << 20, ..Default::default() };
//! # let dev = MemDevice::new(vec![0; opts.size as usize]);
//! # uext4::mkfs::make(&dev, &opts, true)?;
//! # let fs = Filesystem::open_device(Arc::new(dev), Options::default())?;
//! match fs.lookup_path(b"/no/such/file") {
//!     Err(e @ Error::NotFound(_)) => assert_eq!(e.errno(), libc::ENOENT),
//!     other => panic!("{other:?}"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Layers, top to bottom (nothing imports upward): the namespace (`ns`: stat, paths,
//! walks, changes of names and attributes); files, directories, inline data and
//! xattrs (`file`, `dir`, `inline`, `xattr`); the inode table (`inodes`); block
//! mapping (`extent`); the allocator (`alloc`); the `journal`; the `volume`
//! (device, cache, geometry, superblock, descriptors, error state); the bounded
//! buffer `cache`; the `dev` block-device layer; and `format`, the pure dictionary
//! of on-disk structures. `fs` holds the `Filesystem` façade that the upper layers
//! extend; the lower ones (`volume` and below, `alloc`) are types of their own.
//! docs/ARCHITECTURE.md records the layers, types and lock order as built.

#[doc(hidden)]
pub mod alloc;
#[doc(hidden)]
pub mod cache;
pub mod clock;
#[doc(hidden)]
pub mod dev;
#[doc(hidden)]
pub mod dir;
#[doc(hidden)]
pub mod error;
#[doc(hidden)]
pub mod extent;
#[doc(hidden)]
pub mod file;
#[doc(hidden)]
pub mod format;
#[doc(hidden)]
pub mod fs;
#[doc(hidden)]
pub mod fuzzing;
#[doc(hidden)]
pub mod inline;
#[doc(hidden)]
pub mod inodes;
#[doc(hidden)]
pub mod journal;
#[doc(hidden)]
pub mod locks;
mod memo;
pub mod mkfs;
#[doc(hidden)]
pub mod ns;
#[doc(hidden)]
pub mod number_map;
#[doc(hidden)]
pub mod padded;
#[doc(hidden)]
pub mod tunables;
#[doc(hidden)]
pub mod volume;
#[doc(hidden)]
pub mod xattr;

pub use alloc::{DirReserve, Owner};
pub use dev::{BlockDevice, BoundedDevice, FileDevice, HostRange, IoStats, MemDevice, Region};
pub use dir::DirEntryOwned as DirEntry;
pub use error::{Error, Result};
pub use file::space;
pub use file::{ReadPiece, ReadPlan};
pub use format::inode::Timestamp;
pub use fs::{Errors, Filesystem, Options};
pub use ns::change::SetAttr;
pub use ns::remove_tree::RemovedTree;
pub use ns::{FileType, Stat, StatFs, ROOT_INO};
pub use tunables::Tunable;
pub use volume::{errors_panicked, is_errors_panic};
pub use xattr::{XATTR_CREATE, XATTR_REPLACE};
