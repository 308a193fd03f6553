//! Which guest process a virtio-gpu context belongs to (ARCHITECTURE.md §5).
//!
//! The host runs all contexts of one guest process in one worker process and
//! never mixes two guest processes in one. A DRM file holds one context, so
//! the host cannot tell from the virtio-gpu commands which contexts belong
//! together; guest-lib says so in the context's debug name, which the guest
//! kernel forwards in `CTX_CREATE`: `rgpu:<32 hex digits>:<name>`. The tag is
//! a random 128-bit value drawn once per guest process and never shown to
//! anyone else, so another guest process cannot join the group without
//! reading this process's memory. A context without a tag (an older guest
//! kernel that cannot set debug names) gets a worker of its own.

/// The name guest-lib gives a context: `<pid>:<comm>`, so the host can
/// list the guest's processes by the ids the guest knows them by (NVML's
/// process lists).
pub fn process_debug_name(pid: u32, comm: &str) -> String {
    format!("{pid}:{comm}")
}

/// The guest process id of a name made by [`process_debug_name`].
pub fn guest_pid(name: &str) -> Option<u32> {
    let (pid, _) = name.split_once(':')?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok().filter(|pid| *pid != 0)
}

/// What precedes the tag in a debug name.
pub const TAG_PREFIX: &str = "rgpu:";
/// Hex digits of a tag.
pub const TAG_DIGITS: usize = 32;

/// The debug name that carries `tag` (then as much of `name` as fits in
/// `limit` bytes, cut at a character boundary).
pub fn tagged_debug_name(tag: u128, name: &str, limit: usize) -> String {
    let mut out = format!("{TAG_PREFIX}{tag:032x}:");
    for c in name.chars().filter(|c| *c != '\0') {
        if out.len() + c.len_utf8() > limit {
            break;
        }
        out.push(c);
    }
    out
}

/// The tag a debug name carries, if any, and the name without it.
pub fn parse_debug_name(debug_name: &str) -> (Option<u128>, &str) {
    let Some(rest) = debug_name.strip_prefix(TAG_PREFIX) else {
        return (None, debug_name);
    };
    let (Some(digits), Some(name)) = (rest.get(..TAG_DIGITS), rest.get(TAG_DIGITS..)) else {
        return (None, debug_name);
    };
    if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return (None, debug_name);
    }
    match (u128::from_str_radix(digits, 16), name.strip_prefix(':')) {
        (Ok(tag), Some(name)) => (Some(tag), name),
        (Ok(tag), None) if name.is_empty() => (Some(tag), name),
        _ => (None, debug_name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_names_are_cut_to_the_limit() {
        let tag = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210;
        let name = tagged_debug_name(tag, "python3", 63);
        assert_eq!(name, "rgpu:0123456789abcdeffedcba9876543210:python3");
        assert_eq!(parse_debug_name(&name), (Some(tag), "python3"));
        let long = tagged_debug_name(tag, &"é".repeat(40), 63);
        assert!(long.len() <= 63, "{}", long.len());
        assert_eq!(parse_debug_name(&long).0, Some(tag));
        // The kernel may cut the name right after the tag.
        assert_eq!(
            parse_debug_name(&name[..TAG_PREFIX.len() + TAG_DIGITS]).0,
            Some(tag)
        );
    }

    #[test]
    fn guest_pids_are_read_from_process_names() {
        let name = process_debug_name(4242, "python3");
        assert_eq!(name, "4242:python3");
        assert_eq!(guest_pid(&name), Some(4242));
        assert_eq!(guest_pid("7:a:b"), Some(7));
        for bad in [
            "python3",
            ":x",
            "0:x",
            "+1:x",
            "12a:x",
            "99999999999:x",
            "-1:x",
        ] {
            assert_eq!(guest_pid(bad), None, "{bad}");
        }
    }

    #[test]
    fn untagged_and_malformed_names_have_no_tag() {
        assert_eq!(parse_debug_name("python3"), (None, "python3"));
        assert_eq!(parse_debug_name("rgpu:xyz"), (None, "rgpu:xyz"));
        let bad = "rgpu:0123456789abcdeffedcba987654321g:x";
        assert_eq!(parse_debug_name(bad), (None, bad));
        let no_colon = "rgpu:0123456789abcdeffedcba9876543210x";
        assert_eq!(parse_debug_name(no_colon), (None, no_colon));
        let sign = "rgpu:+123456789abcdeffedcba9876543210:x";
        assert_eq!(parse_debug_name(sign), (None, sign));
    }
}
