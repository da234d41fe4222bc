//! The `ddb-projector` command line: parses, runs, and exits with the
//! code `ddb_projector::cli::exit_code` gives the command's result.

use std::process::ExitCode;

fn main() -> ExitCode {
    fix_mmap_threshold();
    // Lambda starts the bootstrap without arguments.
    ddb_projector::cli_main()
}

/// glibc raises its mmap threshold to the size of the largest mmapped block
/// freed (up to 32 MiB); after that, large buffers (an invocation's event,
/// a batch's JSON) come from the heap and their pages stay with the process
/// once freed. A fixed threshold (glibc's starting 128 KiB) keeps them
/// mmapped, returned to the system when freed: peak memory on a
/// 10,000-record Lambda batch goes from 42.6 to 34.0 MB (docs/performance.md).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn fix_mmap_threshold() {
    use std::ffi::c_int;
    const M_MMAP_THRESHOLD: c_int = -3;
    unsafe extern "C" {
        fn mallopt(param: c_int, value: c_int) -> c_int;
    }
    // SAFETY: `mallopt` only sets an allocator parameter; this runs first
    // in `main`, before any other thread exists.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn fix_mmap_threshold() {}
