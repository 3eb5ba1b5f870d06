//! Devices per role, from config strings `cpu` or `cuda:N`, and the memory check made before
//! any large allocation.
use anyhow::{bail, Result};
use candle_core::Device;

/// `MemAvailable` of /proc/meminfo, in bytes (None where it cannot be read).
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The sum of the `k` largest of `values`: the most tokens a batch of `k` rows drawn from rows of
/// these lengths can hold.
pub fn sum_of_largest(mut values: Vec<usize>, k: usize) -> usize {
    values.sort_unstable_by(|a, b| b.cmp(a));
    values.iter().take(k).sum()
}

/// Refuse, before allocating, work that needs `need` bytes on `device` when that is more than
/// the memory available: `what(need_mib, free_mib)` says what needs it and which keys to lower.
/// Callers pass a lower bound of the need (fit-rm's activations, a MADPO update's longest
/// pairs) or the worst case the work can reach (a KV cache or MARLHF update at
/// `max_new_tokens`), and their message says which; on a GPU the driver's own out-of-memory
/// error stands (candle reports it as an error, not an abort).
pub fn ensure_fits(device: &Device, need: u128, what: impl FnOnce(u128, u64) -> String) -> Result<()> {
    if let (true, Some(free)) = (device.is_cpu(), available_memory()) {
        if need > free as u128 {
            bail!("{}", what(need >> 20, free >> 20));
        }
    }
    Ok(())
}

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

#[cfg(test)]
mod tests {
    /// A batch bound counts the longest rows a batch can hold; the memory a model's update needs
    /// grows with them (8 bytes per logit: the f32 value and its gradient).
    #[test]
    fn a_batch_is_bounded_by_its_longest_rows() {
        let lengths = vec![10, 300, 20, 250, 40, 30];
        assert_eq!(super::sum_of_largest(lengths.clone(), 2), 550);
        assert_eq!(super::sum_of_largest(lengths.clone(), 4), 300 + 250 + 40 + 30);
        assert_eq!(super::sum_of_largest(lengths, usize::MAX), 650, "more rows than there are: all rows");
        let cfg = pbrl_model::tiny::tiny_config(pbrl_model::Architecture::Llama, 1000, true);
        assert_eq!(cfg.logit_and_grad_bytes(550), 550 * 1000 * 8);
        let per_layer = 2 * cfg.hidden_size + 3 * cfg.intermediate_size;
        assert_eq!(cfg.train_activation_bytes(10), (10 * cfg.num_hidden_layers * per_layer * 4) as u128);
    }

    #[test]
    fn work_beyond_the_memory_available_is_refused_naming_it() {
        let e = super::ensure_fits(&candle_core::Device::Cpu, u128::MAX, |need, free| format!("{need} > {free}"));
        if super::available_memory().is_some() {
            assert!(e.unwrap_err().to_string().contains(" > "));
        }
        assert!(super::ensure_fits(&candle_core::Device::Cpu, 0, |_, _| unreachable!()).is_ok());
    }
}
