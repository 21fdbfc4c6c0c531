//! This process's memory, from `/proc/self/status` (Linux), for memory benchmarks run as
//! ignored tests: reset the peak after the set-up, read it after the work.

/// Resets the kernel's peak-RSS mark (`VmHWM`) to the current RSS (`/proc/self/clear_refs` =
/// 5). False where that is not possible (not Linux, or not allowed).
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Peak resident set size in MiB since the start or the last [`reset_peak_rss`] (`VmHWM`).
pub fn peak_rss_mib() -> Option<f64> {
    status_kib("VmHWM:").map(|kib| kib as f64 / 1024.0)
}

/// Current resident set size in MiB (`VmRSS`).
pub fn rss_mib() -> Option<f64> {
    status_kib("VmRSS:").map(|kib| kib as f64 / 1024.0)
}

/// Runs `work` with the peak reset just before it; returns its output, how long it took, and
/// the RSS before and the peak RSS during it, in MiB (0 where `/proc` tells nothing).
pub async fn measure<T>(work: impl std::future::Future<Output = T>) -> Measured<T> {
    let rss_before_mib = rss_mib().unwrap_or(0.0);
    let reset = reset_peak_rss();
    let started = std::time::Instant::now();
    let output = work.await;
    Measured {
        output,
        took: started.elapsed(),
        rss_before_mib,
        peak_rss_mib: if reset {
            peak_rss_mib().unwrap_or(0.0)
        } else {
            0.0
        },
    }
}

/// What [`measure`] returns.
#[derive(Debug)]
pub struct Measured<T> {
    /// The work's output.
    pub output: T,
    /// How long it took.
    pub took: std::time::Duration,
    /// RSS just before it, in MiB.
    pub rss_before_mib: f64,
    /// Peak RSS while it ran, in MiB.
    pub peak_rss_mib: f64,
}

fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_processes_rss_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(rss_mib().is_some_and(|m| m > 0.0));
            assert!(reset_peak_rss());
            assert!(peak_rss_mib() >= rss_mib().map(|m| m * 0.5));
        }
    }
}
