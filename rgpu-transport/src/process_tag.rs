//! This process's group tag (`rgpu_proto::process_group`): every context it
//! creates carries it, so the host runs them in one worker process.

use std::sync::Mutex;

/// The tag and the process it was drawn for: a forked child draws its own,
/// so it never shares the parent's worker (and memory).
static TAG: Mutex<Option<(u32, u128)>> = Mutex::new(None);

/// The name guest-lib gives this process's contexts: its id and name, so
/// that the host's NVML answers name guest processes as the guest knows
/// them.
pub fn process_name() -> String {
    let comm = std::fs::read_to_string("/proc/self/comm")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "rgpu".to_owned());
    rgpu_proto::process_group::process_debug_name(std::process::id(), &comm)
}

/// This process's tag, drawn from the kernel's random source on first use.
pub fn process_tag() -> u128 {
    let pid = std::process::id();
    let mut tag = TAG.lock().unwrap_or_else(|e| e.into_inner());
    match *tag {
        Some((owner, value)) if owner == pid => value,
        _ => {
            let value = random_u128();
            *tag = Some((pid, value));
            value
        }
    }
}

fn random_u128() -> u128 {
    let mut bytes = [0u8; 16];
    let mut filled = 0;
    while filled < bytes.len() {
        let rest = bytes.get_mut(filled..).unwrap_or_default();
        // SAFETY: getrandom writes at most `rest.len()` bytes into `rest`.
        let got = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        match usize::try_from(got) {
            Ok(n) => filled += n,
            // EINTR: try again; nothing else can fail with these arguments
            // on a kernel that has getrandom (3.17+).
            Err(_) if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {
            }
            Err(_) => break,
        }
    }
    u128::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tag_is_stable_within_a_process_and_random() {
        let tag = process_tag();
        assert_eq!(process_tag(), tag);
        assert_ne!(tag, 0);
        assert_ne!(random_u128(), random_u128());
    }
}
