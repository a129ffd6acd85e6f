//! Turning a finished run's [`Output`] into an answer the caller can trust: a nonzero exit,
//! a stop by signal, or a stream cut at [`OUTPUT_CAP`] becomes one clear error that says so.

use super::{Output, OUTPUT_CAP};
use crate::remote::{RemoteError, Result};

/// Most bytes of stderr quoted in an error message.
const STDERR_QUOTE: usize = 512;

impl Output {
    /// What was cut, for messages: `None` when both streams arrived whole.
    pub fn cut_note(&self) -> Option<String> {
        let mut notes = Vec::new();
        for (name, cut) in [("stdout", self.stdout_cut), ("stderr", self.stderr_cut)] {
            if cut > 0 {
                notes.push(format!(
                    "{name} cut at {OUTPUT_CAP} bytes ({cut} more bytes dropped)"
                ));
            }
        }
        (!notes.is_empty()).then(|| notes.join(", "))
    }

    /// The output of a run that exited 0 with its standard output whole; otherwise an error
    /// naming `what`, the exit (143: stopped by SIGTERM, a cancel), the cut and stderr's end.
    pub fn success(self, what: &str) -> Result<Output> {
        if self.code == 0 && self.stdout_cut == 0 {
            return Ok(self);
        }
        let mut msg = match self.code {
            0 => "exit 0".to_string(),
            143 => "stopped by SIGTERM (exit 143: cancelled)".to_string(),
            c if c > 128 => format!("killed by signal {} (exit {c})", c - 128),
            c => format!("exit {c}"),
        };
        if let Some(note) = self.cut_note() {
            msg.push_str("; ");
            msg.push_str(&note);
        }
        let tail_start = self.stderr.len().saturating_sub(STDERR_QUOTE);
        let tail = String::from_utf8_lossy(&self.stderr[tail_start..]);
        if !tail.trim().is_empty() {
            msg.push_str(": ");
            msg.push_str(tail.trim());
        }
        Err(if self.code == 0 {
            RemoteError::TooLarge(format!("{what}: {msg}"))
        } else {
            RemoteError::Io(what.to_string(), msg)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_stdout_is_an_error_that_counts_the_dropped_bytes() {
        let out = Output {
            stdout_cut: 12,
            ..Output::default()
        };
        let e = out.success("stat").unwrap_err().to_string();
        assert!(
            e.contains("stdout cut at 8388608 bytes (12 more bytes dropped)"),
            "{e}"
        );
    }

    #[test]
    fn exit_143_says_cancelled() {
        let out = Output {
            code: 143,
            stderr: b"sbxfs: job x cancelled\n".to_vec(),
            ..Output::default()
        };
        let e = out.success("grep").unwrap_err().to_string();
        assert!(
            e.contains("exit 143: cancelled") && e.contains("job x cancelled"),
            "{e}"
        );
    }
}
