//! Premise check for issue 14: does write(header) + vmsplice(lent RAM) +
//! splice(pipe -> socket) lower the sender's CPU per 128 KiB reply over a
//! Unix stream socket, compared with sendmsg(header, RAM)? A forked
//! receiver (like fio, another process) reads each reply as libnbd does:
//! the 16-byte header, then the payload into one buffer.
//!
//! usage: zcprobe MODE N [BS] [BATCH] [HOT]
//!   MODE 0 = sendmsg, 1 = write + vmsplice + splice
//!   BATCH replies per splice (mode 1) / per sendmsg (mode 0)
//!   HOT=1: offsets within the first 4 MiB (cache-warm) instead of 256 MiB
use std::time::Instant;

const MEM: usize = 256 << 20;

fn cpu_us(who: i32) -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(who, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 * 1e6 + tv.tv_usec as f64;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn read_exact(fd: i32, buf: &mut [u8]) -> bool {
    let mut off = 0;
    while off < buf.len() {
        let r = unsafe { libc::recv(fd, buf[off..].as_mut_ptr().cast(), buf.len() - off, 0) };
        if r <= 0 {
            return false;
        }
        off += r as usize;
    }
    true
}

/// The receiver process: reads `n` replies, then writes its CPU per reply
/// to `report` and exits.
fn receive(fd: i32, report: i32, n: usize, bs: usize) -> ! {
    let mut hdr = [0u8; 16];
    let mut buf = vec![0u8; bs];
    let c0 = cpu_us(libc::RUSAGE_SELF);
    let mut got = 0;
    while got < n && read_exact(fd, &mut hdr) && read_exact(fd, &mut buf) {
        got += 1;
    }
    let c = (cpu_us(libc::RUSAGE_SELF) - c0) / got as f64;
    let b = c.to_le_bytes();
    unsafe { libc::write(report, b.as_ptr().cast(), 8) };
    unsafe { libc::_exit(0) }
}

/// Mode 0: one sendmsg of header + data per reply of the batch, until all is written.
fn send_by_copy(fd: i32, hdr: &[u8; 16], data: impl Iterator<Item = *mut u8>, bs: usize) {
    let mut iov = Vec::new();
    for d in data {
        iov.push(libc::iovec { iov_base: hdr.as_ptr() as *mut _, iov_len: 16 });
        iov.push(libc::iovec { iov_base: d.cast(), iov_len: bs });
    }
    let mut i = 0;
    while i < iov.len() {
        let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
        m.msg_iov = iov[i..].as_mut_ptr();
        m.msg_iovlen = iov.len() - i;
        let mut w = unsafe { libc::sendmsg(fd, &m, 0) };
        assert!(w > 0);
        while w > 0 {
            if w as usize >= iov[i].iov_len {
                w -= iov[i].iov_len as isize;
                i += 1;
            } else {
                iov[i].iov_base = unsafe { (iov[i].iov_base as *mut u8).add(w as usize) }.cast();
                iov[i].iov_len -= w as usize;
                w = 0;
            }
        }
    }
}

/// Mode 1: write each header and vmsplice each reply's data into the pipe,
/// then splice the batch into the socket.
fn send_by_splice(fd: i32, pf: [i32; 2], hdr: &[u8; 16], data: impl Iterator<Item = *mut u8>, bs: usize) {
    let mut total = 0;
    for d in data {
        assert_eq!(unsafe { libc::write(pf[1], hdr.as_ptr().cast(), 16) }, 16);
        let mut iov = libc::iovec { iov_base: d.cast(), iov_len: bs };
        while iov.iov_len > 0 {
            let v = unsafe { libc::vmsplice(pf[1], &iov, 1, 0) };
            assert!(v > 0, "vmsplice {}", std::io::Error::last_os_error());
            iov.iov_base = unsafe { (iov.iov_base as *mut u8).add(v as usize) }.cast();
            iov.iov_len -= v as usize;
        }
        total += 16 + bs;
    }
    while total > 0 {
        let s = unsafe { libc::splice(pf[0], std::ptr::null_mut(), fd, std::ptr::null_mut(), total, libc::SPLICE_F_MOVE) };
        assert!(s > 0, "splice {}", std::io::Error::last_os_error());
        total -= s as usize;
    }
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let mode: u32 = a[1].parse().unwrap();
    let n: usize = a[2].parse().unwrap();
    let bs: usize = a.get(3).map_or(128 << 10, |s| s.parse().unwrap());
    let batch: usize = a.get(4).map_or(1, |s| s.parse().unwrap());
    let hot = a.get(5).is_some_and(|s| s == "1");
    let span = if hot { 4 << 20 } else { MEM };
    let mut sv = [0i32; 2];
    assert_eq!(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, sv.as_mut_ptr()) }, 0);
    // Receiver: another process, reports its CPU on a pipe.
    let mut rp = [0i32; 2];
    unsafe { libc::pipe(rp.as_mut_ptr()) };
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        unsafe { libc::close(sv[0]) };
        receive(sv[1], rp[1], n, bs);
    }
    unsafe { libc::close(sv[1]) };
    let fd = sv[0];
    if let Ok(v) = std::env::var("SNDBUF") {
        let v: i32 = v.parse().unwrap();
        unsafe { libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, (&v as *const i32).cast(), 4) };
    }
    let mem = unsafe {
        libc::mmap(std::ptr::null_mut(), MEM, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    } as *mut u8;
    unsafe { std::ptr::write_bytes(mem, 1, MEM) };
    let mut pf = [0i32; 2];
    unsafe { libc::pipe2(pf.as_mut_ptr(), libc::O_CLOEXEC) };
    let psz = unsafe { libc::fcntl(pf[1], libc::F_SETPIPE_SZ, 1 << 20) };
    assert!(psz >= 1 << 20);
    let hdr = [0u8; 16];
    let mut seed: u64 = 1;
    let mut next_off = || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        ((seed >> 20) as usize % (span / bs)) * bs
    };
    let c0 = cpu_us(libc::RUSAGE_SELF);
    let t0 = Instant::now();
    let mut sent = 0;
    while sent < n {
        let k = batch.min(n - sent);
        if mode == 0 {
            send_by_copy(fd, &hdr, (0..k).map(|_| unsafe { mem.add(next_off()) }), bs);
        } else {
            send_by_splice(fd, pf, &hdr, (0..k).map(|_| unsafe { mem.add(next_off()) }), bs);
        }
        sent += k;
    }
    let t = t0.elapsed().as_secs_f64();
    let scpu = (cpu_us(libc::RUSAGE_SELF) - c0) / n as f64;
    let mut b = [0u8; 8];
    unsafe { libc::read(rp[0], b.as_mut_ptr().cast(), 8) };
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    let rcpu = f64::from_le_bytes(b);
    println!(
        "mode={} bs={} batch={} hot={} MiB/s={:.0} sender_us/msg={:.2} receiver_us/msg={:.2}",
        if mode == 0 { "sendmsg" } else { "vmsplice" }, bs, batch, hot as u8,
        n as f64 * bs as f64 / t / 1048576.0, scpu, rcpu
    );
}
