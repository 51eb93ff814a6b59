//! The IOs the hosts have outstanding, by id (the request's cookie): ids
//! of answered IOs are reused.

use pace::Nanos;

/// An IO a host has outstanding.
#[derive(Debug, Clone, Default)]
pub(super) struct Io {
    pub host: usize,
    pub read: bool,
    pub bytes: u32,
    pub issued: Nanos,
    /// False once answered, or lost with its connection.
    pub live: bool,
    /// The socket it went on.
    pub sock: u32,
    /// Its byte offset, and on an NVMe/TCP queue its command id.
    pub offset: u64,
    pub cid: u16,
}

#[derive(Default)]
pub(super) struct Ios {
    ios: Vec<Io>,
    free: Vec<u32>,
}

impl Ios {
    /// A new outstanding IO: its id.
    pub fn add(&mut self, io: Io) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.ios[i as usize] = io;
                i
            }
            None => {
                self.ios.push(io);
                (self.ios.len() - 1) as u32
            }
        }
    }

    pub fn get(&self, id: u32) -> &Io {
        &self.ios[id as usize]
    }

    /// IO `id` went out as NVMe/TCP command `cid`.
    pub fn set_cid(&mut self, id: u32, cid: u16) {
        self.ios[id as usize].cid = cid;
    }

    /// IO `id`'s reply reached its host: the IO, unless its connection
    /// died first (a fault). Its id is free again.
    pub fn answered(&mut self, id: u32) -> Option<Io> {
        if !self.ios[id as usize].live {
            return None;
        }
        let io = std::mem::take(&mut self.ios[id as usize]);
        self.free.push(id);
        Some(io)
    }

    /// Data bytes that follow the reply header of IO `cookie` with `error`.
    pub fn data_len(&self, cookie: u64, error: u32) -> u32 {
        let io = &self.ios[cookie as usize];
        if io.read && error == 0 {
            io.bytes
        } else {
            0
        }
    }

    /// Socket `s` is down: its IOs are lost. How many.
    pub fn lose(&mut self, s: usize) -> u64 {
        let mut lost = 0;
        for io in (self.ios.iter_mut()).filter(|io| io.live && io.sock == s as u32) {
            io.live = false;
            lost += 1;
        }
        lost
    }

    /// Whether an IO is outstanding on socket `s`.
    pub fn busy(&self, s: usize) -> bool {
        self.ios.iter().any(|io| io.live && io.sock == s as u32)
    }

    /// The first outstanding IO for which `hung` holds, with its id.
    pub fn find(&self, hung: impl Fn(&Io) -> bool) -> Option<(usize, &Io)> {
        let id = self.ios.iter().position(|io| io.live && hung(io))?;
        Some((id, &self.ios[id]))
    }

    /// IOs outstanding.
    pub fn live(&self) -> u64 {
        self.ios.iter().filter(|i| i.live).count() as u64
    }
}
