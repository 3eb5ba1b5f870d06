//! Devices per role, from config strings `cpu` or `cuda:N`.
use anyhow::{bail, Result};
use candle_core::Device;

/// Parse a device string for `role` (named in errors, e.g. "agent_devices[1]").
pub fn parse_device(spec: &str, role: &str) -> Result<Device> {
    let s = spec.trim().to_lowercase();
    if s == "cpu" {
        return Ok(Device::Cpu);
    }
    let ordinal = match s.as_str() {
        "cuda" => Some(0),
        _ => s.strip_prefix("cuda:").and_then(|n| n.parse::<usize>().ok()),
    };
    let Some(ordinal) = ordinal else {
        bail!("{role}: unknown device `{spec}` (use `cpu` or `cuda:N`)");
    };
    cuda_device(ordinal, role)
}

#[cfg(feature = "cuda")]
fn cuda_device(ordinal: usize, role: &str) -> Result<Device> {
    Device::new_cuda(ordinal).map_err(|e| anyhow::anyhow!("{role}: cannot open cuda:{ordinal}: {e}"))
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(ordinal: usize, role: &str) -> Result<Device> {
    bail!("{role}: `cuda:{ordinal}` needs a pbrl built with the `cuda` feature (cargo build --release --features cuda)")
}

/// The thread count a user asked for: `--threads`, else `PBRL_THREADS`; 0 or a value that is
/// not a number is an error naming where it came from.
pub fn requested_threads(flag: Option<usize>) -> Result<Option<usize>> {
    if let Some(n) = flag {
        if n == 0 {
            bail!("--threads 0: give at least one thread");
        }
        return Ok(Some(n));
    }
    match std::env::var("PBRL_THREADS") {
        Err(_) => Ok(None),
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => bail!("PBRL_THREADS={v:?}: give a positive number of threads"),
        },
    }
}

/// Threads for candle's CPU kernels and rayon: the requested count, else the physical cores.
/// Set before any kernel runs, since oversubscription collapses throughput.
pub fn init_threads(requested: Option<usize>) -> usize {
    let n = requested.filter(|&n| n > 0).unwrap_or_else(num_cpus::get_physical);
    // candle reads RAYON_NUM_THREADS (gemm, rayon) and CANDLE_NUM_THREADS (its barrier pool).
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    std::env::set_var("CANDLE_NUM_THREADS", n.to_string());
    let _ = rayon::ThreadPoolBuilder::new().num_threads(n).build_global();
    keep_freed_memory();
    n
}

/// Make glibc's malloc reuse freed tensor buffers instead of returning them to the kernel.
///
/// By default every buffer above a (dynamic, at most 32 MiB) threshold is a fresh mmap, and the
/// kernel zeroes each of its pages on first touch; a training step allocates gigabytes of
/// activations and gradients (the tied embedding's gradient alone is 113 MB), and that zeroing
/// was a fifth of its time. With mmap off and the heap never trimmed, a step reuses the pages
/// of the one before: measured on the train-step benchmark, 233k page faults per step before,
/// ~1k after, with the same peak RSS.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning parameters; it is called before the
    // threads that allocate tensors start working.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, -1);
    }
}
