//! Workloads that compare uext4 with the kernel and e2fsprogs (see src/bin/).
