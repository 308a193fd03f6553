//! Child processes, as /proc shows them: how the tests see the daemon's
//! connection processes.

/// A child process; a zombie has ended and is not yet reaped.
#[derive(Debug, Clone, Copy)]
pub struct ChildProcess {
    pub pid: u32,
    pub zombie: bool,
}

/// Every child process of `parent`, zombies included.
pub fn children_of(parent: u32) -> Vec<ChildProcess> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("stat")).ok())
        .filter_map(|stat| {
            // "pid (comm) state ppid ...": comm may hold spaces, so split
            // after ')'.
            let (head, rest) = stat.rsplit_once(')')?;
            let mut fields = rest.split_whitespace();
            let state = fields.next();
            let ppid = fields.next()?.parse::<u32>().ok()?;
            let pid = head.split_whitespace().next()?.parse::<u32>().ok()?;
            (ppid == parent).then_some(ChildProcess {
                pid,
                zombie: state == Some("Z"),
            })
        })
        .collect()
}

/// Children of `parent` that are alive (not zombies).
pub fn live_children(parent: u32) -> usize {
    children_of(parent).iter().filter(|c| !c.zombie).count()
}
