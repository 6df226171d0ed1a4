//! Running host tools (objdump, `as`) from tests that may themselves run under qemu-user.
//!
//! Under qemu-user a child forked while another thread of the emulated test process holds
//! one of the emulator's internal locks can hang before it ever execs (the fork copies the
//! held lock; a known qemu-user limitation with threads). [`output`] spawns one child at a
//! time per process, and kills and reruns a child still running at the deadline (three
//! tries), so a test binary does not hang on it; a tool that really hangs still fails.

use std::io;
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a host tool may take before its child counts as hung.
pub const DEADLINE: Duration = Duration::from_secs(120);

/// [`Command::output`] with the one-at-a-time spawning and the hung-child retry above.
pub fn output(cmd: &mut Command) -> io::Result<Output> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("packjit-host-tool-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    for _attempt in 0..3 {
        let mut child = cmd
            .stdout(std::fs::File::create(&out)?)
            .stderr(std::fs::File::create(&err)?)
            .spawn()?;
        let deadline = Instant::now() + DEADLINE;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        if let Some(status) = status {
            let result = Output {
                status,
                stdout: std::fs::read(&out)?,
                stderr: std::fs::read(&err)?,
            };
            let _ = std::fs::remove_dir_all(&dir);
            return Ok(result);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        format!("{cmd:?} did not finish in three tries"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_and_status_come_back_like_command_output() {
        let ok = output(Command::new("sh").args(["-c", "echo out; echo err >&2"])).unwrap();
        assert!(ok.status.success());
        assert_eq!(ok.stdout, b"out\n");
        assert_eq!(ok.stderr, b"err\n");
        let failed = output(Command::new("sh").args(["-c", "exit 3"])).unwrap();
        assert_eq!(failed.status.code(), Some(3));
        // Natively the spawn fails; under qemu-user the emulated child reports the failed
        // exec as its exit status instead.
        match output(&mut Command::new("/nonexistent/tool")) {
            Err(_) => {}
            Ok(missing) => assert!(!missing.status.success(), "{missing:?}"),
        }
    }
}
