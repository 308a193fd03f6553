//! The tenant's registry of shareable handles (rgpu_session::shareable)
//! for its worker processes: a thread of the daemon keeps the driver
//! descriptors that the tenant's workers export, and hands copies to
//! workers of the same tenant that import them by token.
//!
//! Every connection and worker process of the tenant inherits one end of a
//! `SOCK_SEQPACKET` pair (`--shareable-fd`); no guest and no other tenant's
//! process has it. Each request brings a reply socket of its own (a fresh
//! pair's end, by `SCM_RIGHTS`), so that requests from many processes at
//! once never read each other's answers, and the broker knows the asking
//! process from that socket's credentials (`SO_PEERCRED` of a pair names
//! its creator). It keeps a pidfd per exporting process and drops what a
//! process deposited once that process has ended.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use std::thread;

use log::{debug, warn};
use rgpu_session::shareable::{ShareableToken, MAX_SHAREABLE_EXPORTS, SHAREABLE_TOKEN_BYTES};
use rgpu_session::shared_ledger::{Holder, Ledger, ShareKey};
use rgpu_session::{MemoryBudget, ShareLedger, ShareableRegistry};

use crate::worker_process::link::{self, Link};

const DEPOSIT: u8 = 1;
const FETCH: u8 = 2;
const WITHDRAW: u8 = 3;
/// The tenant's ledger of shared memory (rgpu_session::shared_ledger):
/// each is (kind, key, member) and SHARE adds a size.
const SHARE: u8 = 4;
const HOLD: u8 = 5;
const LET_GO: u8 = 6;
const UNSHARE: u8 = 7;
/// Longest request: a share (kind, key, member, size).
const REQUEST_BYTES: usize = 1 + 64 + 16;
/// Longest reply: a fetch's (status, size).
const REPLY_BYTES: usize = 9;

/// Starts the broker thread, whose ledger charges `budget` (the tenant's)
/// for what it carries; answers the end every process of the tenant
/// inherits (close-on-exec: a child is given it explicitly).
pub fn start(budget: Option<Arc<dyn MemoryBudget>>) -> io::Result<OwnedFd> {
    let (broker, clients) = link::pair()?;
    thread::Builder::new()
        .name("rgpu-shareable".into())
        .spawn(move || {
            Broker {
                budget,
                ..Broker::default()
            }
            .serve(&broker)
        })?;
    Ok(clients)
}

#[derive(Debug)]
struct Deposit {
    pid: i32,
    key: u64,
    size: u64,
    fd: OwnedFd,
}

#[derive(Default)]
struct Broker {
    deposits: HashMap<ShareableToken, Deposit>,
    /// A pidfd per process with deposits or in the ledger.
    exporters: HashMap<i32, OwnedFd>,
    ledger: Ledger,
    budget: Option<Arc<dyn MemoryBudget>>,
}

impl Broker {
    /// Serves until every holder of the other end has gone.
    fn serve(mut self, link: &Link) {
        let mut buf = vec![0u8; crate::worker_process::message::MAX_MESSAGE_BYTES + 1];
        while self.serve_once(link, &mut buf) {}
    }

    /// Waits for a request or an exporter's end and handles what came;
    /// false once the broker should stop.
    fn serve_once(&mut self, link: &Link, buf: &mut [u8]) -> bool {
        let mut polled: Vec<libc::pollfd> = std::iter::once(link.raw_fd())
            .chain(self.exporters.values().map(AsRawFd::as_raw_fd))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `polled` is a live array of that many pollfds.
        let ready = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as _, -1) };
        if ready < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return true;
            }
            warn!("shareable-handle broker: poll failed: {e}; it stops");
            return false;
        }
        let ended: Vec<i32> = polled
            .iter()
            .skip(1)
            .filter(|p| p.revents != 0)
            .filter_map(|p| {
                self.exporters
                    .iter()
                    .find(|(_, fd)| fd.as_raw_fd() == p.fd)
                    .map(|(pid, _)| *pid)
            })
            .collect();
        for pid in ended {
            self.exporters.remove(&pid);
            self.ledger.process_ended(pid, self.budget.as_deref());
            let before = self.deposits.len();
            self.deposits.retain(|_, d| d.pid != pid);
            debug!(
                "shareable-handle broker: process {pid} ended; {} export(s) withdrawn",
                before - self.deposits.len()
            );
        }
        if polled.first().is_some_and(|p| p.revents == 0) {
            return true;
        }
        match link.recv(buf) {
            Ok(Some((len, fds))) => {
                self.answer(buf.get(..len).unwrap_or_default(), fds);
                true
            }
            Ok(None) => false,
            Err(e) => {
                warn!("shareable-handle broker: {e}; it stops");
                false
            }
        }
    }

    /// Answers one request on the reply socket it brought (its first
    /// descriptor); a malformed one is dropped (its sender sees its reply
    /// socket close).
    fn answer(&mut self, request: &[u8], fds: Vec<OwnedFd>) {
        let mut fds = fds.into_iter();
        let Some(reply) = fds.next() else {
            return;
        };
        let reply = Link::from_fd(reply);
        let Some(pid) = creator_pid(&reply) else {
            return;
        };
        let (kind, rest) = request.split_first().unwrap_or((&0, &[]));
        let token = |bytes: &[u8]| -> Option<ShareableToken> {
            bytes.get(..SHAREABLE_TOKEN_BYTES)?.try_into().ok()
        };
        let word = |bytes: &[u8], at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
        };
        let sent = match *kind {
            DEPOSIT => {
                let parsed = token(rest)
                    .zip(word(rest, SHAREABLE_TOKEN_BYTES))
                    .zip(word(rest, SHAREABLE_TOKEN_BYTES + 8));
                let (Some(((token, key), size)), Some(fd)) = (parsed, fds.next()) else {
                    return;
                };
                let kept = self.deposit(pid, token, key, size, fd);
                reply.send(&[u8::from(kept)], &[])
            }
            FETCH => {
                let Some(token) = token(rest) else {
                    return;
                };
                match self.deposits.get(&token) {
                    Some(deposit) => {
                        let mut answer = vec![1u8];
                        answer.extend_from_slice(&deposit.size.to_le_bytes());
                        reply.send(&answer, &[deposit.fd.as_raw_fd()])
                    }
                    None => reply.send(&[0], &[]),
                }
            }
            WITHDRAW => {
                let Some(key) = word(rest, 0) else {
                    return;
                };
                self.deposits.retain(|_, d| !(d.pid == pid && d.key == key));
                reply.send(&[1], &[])
            }
            SHARE | HOLD | LET_GO | UNSHARE => {
                let key: Option<ShareKey> = rest.get(..64).and_then(|k| k.try_into().ok());
                let (Some(key), Some(member)) = (key, word(rest, 64)) else {
                    return;
                };
                let by = Holder { pid, member };
                let budget = self.budget.clone();
                let budget = budget.as_deref();
                let done = match *kind {
                    SHARE => {
                        let Some(size) = word(rest, 72) else {
                            return;
                        };
                        self.watch(pid) && self.ledger.share(by, &key, size)
                    }
                    HOLD => self.watch(pid) && self.ledger.hold(by, &key),
                    LET_GO => {
                        self.ledger.let_go(by, &key, budget);
                        true
                    }
                    _ => {
                        self.ledger.unshare(by, &key, budget);
                        true
                    }
                };
                reply.send(&[u8::from(done)], &[])
            }
            _ => return,
        };
        if let Err(e) = sent {
            debug!("shareable-handle broker: process {pid} left before its answer: {e}");
        }
    }

    fn deposit(
        &mut self,
        pid: i32,
        token: ShareableToken,
        key: u64,
        size: u64,
        fd: OwnedFd,
    ) -> bool {
        if self.deposits.len() >= MAX_SHAREABLE_EXPORTS || !self.watch(pid) {
            return false;
        }
        self.deposits.insert(token, Deposit { pid, key, size, fd });
        true
    }

    /// Watches process `pid` for its end (what it deposited, shared and
    /// held goes then); false if it cannot be watched.
    fn watch(&mut self, pid: i32) -> bool {
        if let std::collections::hash_map::Entry::Vacant(watch) = self.exporters.entry(pid) {
            // SAFETY: pidfd_open takes a pid and flags, and returns a new
            // descriptor or -1.
            let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
            let Ok(raw) = RawFd::try_from(raw) else {
                return false;
            };
            if raw < 0 {
                warn!(
                    "shareable-handle broker: cannot watch process {pid}: {}",
                    io::Error::last_os_error()
                );
                return false;
            }
            // SAFETY: a new descriptor, ours to own.
            watch.insert(unsafe { OwnedFd::from_raw_fd(raw) });
        }
        true
    }
}

/// The process that created the pair `socket` belongs to.
fn creator_pid(socket: &Link) -> Option<i32> {
    let mut credentials = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes one ucred into `credentials`, whose size
    // `len` gives.
    let rc = unsafe {
        libc::getsockopt(
            socket.raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut credentials).cast(),
            &mut len,
        )
    };
    (rc == 0 && credentials.pid > 0).then_some(credentials.pid)
}

/// A worker's side: the tenant's broker, through the inherited end.
#[derive(Debug)]
pub struct BrokerClient {
    link: Mutex<Link>,
}

impl BrokerClient {
    /// Takes over the end inherited as `--shareable-fd`.
    ///
    /// # Safety
    ///
    /// `fd` must be an open descriptor that nothing else in this process
    /// owns.
    pub unsafe fn inherit(fd: RawFd) -> Self {
        Self {
            // SAFETY: the caller's contract.
            link: Mutex::new(Link::from_fd(unsafe { OwnedFd::from_raw_fd(fd) })),
        }
    }

    /// Sends `request` with `fds` after a fresh reply socket, and reads the
    /// answer (and any descriptor) from that socket.
    fn ask(&self, request: &[u8], fds: &[RawFd]) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
        let (reply, theirs) = link::pair()?;
        let mut attached = vec![theirs.as_raw_fd()];
        attached.extend_from_slice(fds);
        self.link
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .send(request, &attached)?;
        // The broker holds the only other copy of our reply socket now.
        drop(theirs);
        let mut buf = [0u8; crate::worker_process::message::MAX_MESSAGE_BYTES + 1];
        match reply.recv(&mut buf)? {
            Some((len, fds)) => Ok((
                buf.get(..len.min(REPLY_BYTES)).unwrap_or_default().to_vec(),
                fds,
            )),
            None => Err(io::Error::other("the broker refused the request")),
        }
    }
}

impl ShareableRegistry for BrokerClient {
    fn deposit(&self, token: &ShareableToken, key: u64, size: u64, fd: BorrowedFd<'_>) -> bool {
        let mut request = Vec::with_capacity(REQUEST_BYTES);
        request.push(DEPOSIT);
        request.extend_from_slice(token);
        request.extend_from_slice(&key.to_le_bytes());
        request.extend_from_slice(&size.to_le_bytes());
        match self.ask(&request, &[fd.as_raw_fd()]) {
            Ok((answer, _)) => answer.first() == Some(&1),
            Err(e) => {
                warn!("shareable-handle broker unreachable: {e}");
                false
            }
        }
    }

    fn fetch(&self, token: &ShareableToken) -> Option<(OwnedFd, u64)> {
        let mut request = vec![FETCH];
        request.extend_from_slice(token);
        let (answer, fds) = self
            .ask(&request, &[])
            .inspect_err(|e| warn!("shareable-handle broker unreachable: {e}"))
            .ok()?;
        if answer.first() != Some(&1) {
            return None;
        }
        let size = u64::from_le_bytes(answer.get(1..9)?.try_into().ok()?);
        let fd = fds.into_iter().next()?;
        Some((fd, size))
    }

    fn withdraw(&self, key: u64) {
        let mut request = vec![WITHDRAW];
        request.extend_from_slice(&key.to_le_bytes());
        if let Err(e) = self.ask(&request, &[]) {
            warn!("shareable-handle broker unreachable: {e}");
        }
    }
}

impl BrokerClient {
    /// Asks the ledger `kind` of `key` for session `member` (and `size`).
    fn ledger(&self, kind: u8, member: u64, key: &ShareKey, size: Option<u64>) -> bool {
        let mut request = Vec::with_capacity(REQUEST_BYTES);
        request.push(kind);
        request.extend_from_slice(key);
        request.extend_from_slice(&member.to_le_bytes());
        if let Some(size) = size {
            request.extend_from_slice(&size.to_le_bytes());
        }
        match self.ask(&request, &[]) {
            Ok((answer, _)) => answer.first() == Some(&1),
            Err(e) => {
                warn!("shareable-handle broker unreachable: {e}");
                false
            }
        }
    }
}

/// The broker charges the tenant's budget itself: the sessions' is not
/// passed on.
impl ShareLedger for BrokerClient {
    fn share(&self, member: u64, key: &ShareKey, size: u64) -> bool {
        self.ledger(SHARE, member, key, Some(size))
    }

    fn hold(&self, member: u64, key: &ShareKey) -> bool {
        self.ledger(HOLD, member, key, None)
    }

    fn let_go(&self, member: u64, key: &ShareKey, _budget: Option<&dyn MemoryBudget>) {
        self.ledger(LET_GO, member, key, None);
    }

    fn unshare(&self, member: u64, key: &ShareKey, _budget: Option<&dyn MemoryBudget>) {
        self.ledger(UNSHARE, member, key, None);
    }
}

impl AsFd for BrokerClient {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // Only for tests that hand the end to a child; the lock guards
        // sends, not the descriptor.
        let link = self
            .link
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // SAFETY: the descriptor lives as long as `self`.
        unsafe { BorrowedFd::borrow_raw(link.raw_fd()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::fd::IntoRawFd;

    fn memfd_with(text: &[u8]) -> OwnedFd {
        // SAFETY: a NUL-terminated name; known flags.
        let raw = unsafe { libc::memfd_create(c"broker-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: just created, ours.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        std::fs::File::from(fd.try_clone().unwrap())
            .write_all(text)
            .unwrap();
        fd
    }

    fn client(end: &OwnedFd) -> BrokerClient {
        // SAFETY: a fresh duplicate, owned by the client alone.
        unsafe { BrokerClient::inherit(end.try_clone().unwrap().into_raw_fd()) }
    }

    #[test]
    fn deposits_are_fetched_by_token_and_withdrawn_by_key() {
        let end = start(None).unwrap();
        let (exporter, importer) = (client(&end), client(&end));
        let memory = memfd_with(b"physical");
        let token = [7u8; SHAREABLE_TOKEN_BYTES];
        assert!(exporter.deposit(&token, 42, 2 << 20, memory.as_fd()));
        let (fd, size) = importer.fetch(&token).expect("fetched");
        assert_eq!(size, 2 << 20);
        let mut file = std::fs::File::from(fd);
        file.rewind().unwrap();
        let mut text = String::new();
        file.read_to_string(&mut text).unwrap();
        assert_eq!(text, "physical");
        assert!(importer.fetch(&[8u8; SHAREABLE_TOKEN_BYTES]).is_none());
        // Another key of the same process leaves it; its own key takes it.
        exporter.withdraw(41);
        assert!(importer.fetch(&token).is_some());
        exporter.withdraw(42);
        assert!(importer.fetch(&token).is_none());
    }

    #[test]
    fn a_process_that_ended_leaves_nothing_behind() {
        let (link, _clients) = link::pair().unwrap();
        let mut broker = Broker::default();
        let mut child = std::process::Command::new("sleep")
            .arg("0.1")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let token = [9u8; SHAREABLE_TOKEN_BYTES];
        assert!(broker.deposit(pid, token, 1, 4096, memfd_with(b"child")));
        assert!(broker.deposit(
            std::process::id() as i32,
            [1; 32],
            2,
            4096,
            memfd_with(b"x")
        ));
        child.wait().unwrap();
        // Its pidfd is readable now: one round drops what it deposited.
        let mut buf = vec![0u8; 64];
        assert!(broker.serve_once(&link, &mut buf));
        assert!(!broker.deposits.contains_key(&token));
        assert!(
            broker.deposits.contains_key(&[1; 32]),
            "a live process's stays"
        );
        assert!(!broker.exporters.contains_key(&pid));
    }

    #[test]
    fn a_killed_exporter_leaves_what_others_hold_charged_until_they_let_go() {
        let (link, _clients) = link::pair().unwrap();
        let budget = Arc::new(rgpu_session::budget::LocalBudget::default());
        let mut broker = Broker {
            budget: Some(budget.clone() as Arc<dyn MemoryBudget>),
            ..Broker::default()
        };
        let mut child = std::process::Command::new("sleep")
            .arg("0.1")
            .spawn()
            .unwrap();
        let exporter = Holder {
            pid: child.id() as i32,
            member: 1,
        };
        let importer = Holder {
            pid: std::process::id() as i32,
            member: 1,
        };
        let key = rgpu_session::shared_ledger::token_key(&[3; 32]);
        assert!(broker.watch(exporter.pid) && broker.ledger.share(exporter, &key, 4096));
        assert!(broker.watch(importer.pid) && broker.ledger.hold(importer, &key));
        assert_eq!(
            budget.used(),
            0,
            "the exporter's own allocation is charged elsewhere"
        );
        child.wait().unwrap();
        // Its end (the pidfd) unshares: the ledger carries the charge.
        let mut buf = vec![0u8; 64];
        assert!(broker.serve_once(&link, &mut buf));
        assert_eq!(budget.used(), 4096);
        assert!(
            !broker.ledger.hold(importer, &key),
            "nobody shares it any more"
        );
        broker.ledger.let_go(importer, &key, Some(budget.as_ref()));
        assert_eq!(budget.used(), 0);
    }
}
