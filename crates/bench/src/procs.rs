//! Processes the harness starts: each is stopped by its PID, also on error
//! and on Ctrl-C (the guard's Drop), and a missing tool names its package.

use std::fs::File;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// SIGINT and SIGTERM set a flag the runner checks; cleanup then runs
/// through the guards' Drop instead of the process dying mid-setup.
pub fn catch_interrupts() {
    let handler: extern "C" fn(libc::c_int) = on_signal;
    // SAFETY: the handler only stores to an atomic, which is signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
        libc::signal(libc::SIGTERM, handler as libc::sighandler_t);
    }
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Err if interrupted, so `?` unwinds to the cleanup.
pub fn check_interrupt() -> Result<(), String> {
    if interrupted() {
        Err("interrupted".into())
    } else {
        Ok(())
    }
}

/// Sleeps in small steps, waking early on Ctrl-C.
pub fn sleep(d: Duration) -> Result<(), String> {
    let end = Instant::now() + d;
    while Instant::now() < end {
        check_interrupt()?;
        std::thread::sleep((end - Instant::now()).min(Duration::from_millis(50)));
    }
    Ok(())
}

/// `tool` on PATH, or an error naming the Debian package that has it.
pub fn require(tool: &str, package: &str) -> Result<(), String> {
    let found = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(tool).is_file()));
    if found {
        Ok(())
    } else {
        Err(format!(
            "`{tool}` is not installed: apt-get install {package}"
        ))
    }
}

/// A started process, stopped (SIGTERM, then SIGKILL) when dropped: our
/// child, or a daemon it forked, known by the PID from its pidfile.
pub struct Proc {
    pub name: String,
    kind: Kind,
    pub log: PathBuf,
}

enum Kind {
    Child(std::process::Child),
    Daemon(libc::pid_t),
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<Proc, String> {
        let out = File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {name} ({:?}): {e}", cmd.get_program()))?;
        Ok(Proc {
            name: name.to_string(),
            kind: Kind::Child(child),
            log: log.to_path_buf(),
        })
    }

    /// Runs a program that daemonizes and writes `pidfile`; the daemon is
    /// then held by that PID.
    pub fn spawn_daemon(
        name: &str,
        cmd: Command,
        log: &Path,
        pidfile: &Path,
    ) -> Result<Proc, String> {
        let mut starter = Proc::spawn(name, cmd, log)?;
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            check_interrupt()?;
            if let Some(pid) = std::fs::read_to_string(pidfile)
                .ok()
                .and_then(|t| t.trim().parse::<libc::pid_t>().ok())
            {
                return Ok(Proc {
                    name: name.to_string(),
                    kind: Kind::Daemon(pid),
                    log: log.to_path_buf(),
                });
            }
            if let Kind::Child(c) = &mut starter.kind {
                if let Ok(Some(st)) = c.try_wait() {
                    if !st.success() {
                        return Err(format!("{name} failed ({st}):\n{}", log_tail(log)));
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(format!("{name} wrote no pidfile {}", pidfile.display()));
            }
            std::thread::sleep(Duration::from_millis(30));
        }
    }

    pub fn pid(&self) -> u32 {
        match &self.kind {
            Kind::Child(c) => c.id(),
            Kind::Daemon(pid) => *pid as u32,
        }
    }

    /// Err with the end of its log if it has exited.
    pub fn check_alive(&mut self) -> Result<(), String> {
        let exited = match &mut self.kind {
            Kind::Child(c) => match c.try_wait() {
                Ok(None) => return Ok(()),
                Ok(Some(status)) => status.to_string(),
                Err(e) => return Err(format!("{}: {e}", self.name)),
            },
            Kind::Daemon(pid) if running(*pid) => return Ok(()),
            Kind::Daemon(_) => "the daemon is gone".to_string(),
        };
        Err(format!(
            "{} exited ({exited}); its log {}:\n{}",
            self.name,
            self.log.display(),
            log_tail(&self.log)
        ))
    }

    /// Waits until `ready` holds, failing if the process dies or time runs out.
    pub fn wait_ready(&mut self, what: &str, ready: impl Fn() -> bool) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            self.check_alive()?;
            check_interrupt()?;
            if ready() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} did not become ready ({what}) in 15 s; log {}:\n{}",
                    self.name,
                    self.log.display(),
                    log_tail(&self.log)
                ));
            }
            std::thread::sleep(Duration::from_millis(30));
        }
    }

    pub fn stop(&mut self) {
        match &mut self.kind {
            Kind::Child(child) => {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                signal(child.id() as libc::pid_t, libc::SIGTERM);
                let deadline = Instant::now() + Duration::from_secs(10);
                while Instant::now() < deadline {
                    if let Ok(Some(_)) = child.try_wait() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = child.kill();
                let _ = child.wait();
            }
            Kind::Daemon(pid) => {
                let pid = *pid;
                // A forking server's per-connection children go with it.
                let mut pids = children_of(pid);
                pids.push(pid);
                for &p in &pids {
                    signal(p, libc::SIGTERM);
                }
                let deadline = Instant::now() + Duration::from_secs(10);
                while Instant::now() < deadline && pids.iter().any(|&p| running(p)) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                for &p in pids.iter().filter(|&&p| running(p)) {
                    signal(p, libc::SIGKILL);
                }
            }
        }
    }
}

fn signal(pid: libc::pid_t, sig: libc::c_int) {
    // SAFETY: signalling a process this harness started, by its PID.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Alive and not a zombie.
fn running(pid: libc::pid_t) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .is_some_and(|zombie| !zombie)
}

/// Direct children of `pid`, from /proc.
pub fn children_of(pid: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = s.rsplit_once(')')?.1.to_string();
                    rest.split_whitespace().nth(1)?.parse::<libc::pid_t>().ok()
                })
                == Some(pid)
        })
        .collect()
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// Whether a TCP connection to `addr` succeeds now.
pub fn tcp_accepts(addr: &str) -> bool {
    let Ok(mut addrs) = addr.to_socket_addrs() else {
        return false;
    };
    addrs.next().is_some_and(|a: SocketAddr| {
        TcpStream::connect_timeout(&a, Duration::from_millis(200)).is_ok()
    })
}

/// Bytes sent but not yet acknowledged on the TCP sockets listening or
/// accepted on local `port` (this namespace's /proc/net/tcp and tcp6):
/// data the target has handed to the kernel that is still on its way.
pub fn tcp_send_queue(port: u16) -> u64 {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .map(|text| send_queue_in(&text, port))
        .sum()
}

fn send_queue_in(table: &str, port: u16) -> u64 {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
            // 01: established.
            if local_port != port || *f.get(3)? != "01" {
                return None;
            }
            u64::from_str_radix(f.get(4)?.split(':').next()?, 16).ok()
        })
        .sum()
}

/// utime + stime of a process and its direct children (a forking server's
/// connections), in seconds.
pub fn cpu_seconds_tree(pid: u32) -> Option<f64> {
    let own = cpu_seconds(pid)?;
    let kids: f64 = children_of(pid as libc::pid_t)
        .into_iter()
        .filter_map(|c| cpu_seconds(c as u32))
        .sum();
    Some(own + kids)
}

/// utime + stime of a process, in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name, which may hold spaces.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some(ticks / hz.max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tool_names_package() {
        let e = require("no-such-tool-iopace", "some-package").expect_err("missing");
        assert!(e.contains("apt-get install some-package"), "{e}");
        require("sh", "dash").expect("sh is everywhere");
    }

    #[test]
    fn send_queue_sums_established_sockets_on_the_port() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue\n\
   0: 01004D0A:2A39 00000000:0000 0A 00000000:00000000 00:00000000\n\
   1: 01004D0A:2A39 0B004D0A:D431 01 00010000:00000000 00:00000000\n\
   2: 01004D0A:2A39 0C004D0A:D432 01 00000100:00000000 00:00000000\n\
   3: 0B004D0A:D431 01004D0A:2A39 01 00100000:00000000 00:00000000\n";
        // Port 0x2A39 = 10809: two established sockets, the listener and the
        // client side (local port 0xD431) do not count.
        assert_eq!(send_queue_in(table, 10809), 0x10000 + 0x100);
    }

    #[test]
    fn own_cpu_time_is_readable() {
        let s = cpu_seconds(std::process::id()).expect("own stat");
        assert!(s >= 0.0);
    }

    #[test]
    fn a_dead_process_reports_its_log() {
        let dir = tempfile::tempdir().expect("dir");
        let log = dir.path().join("x.log");
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo boom; exit 3"]);
        let mut p = Proc::spawn("x", cmd, &log).expect("spawn");
        let e = p.wait_ready("never", || false).expect_err("dies");
        assert!(e.contains("boom"), "{e}");
    }
}
