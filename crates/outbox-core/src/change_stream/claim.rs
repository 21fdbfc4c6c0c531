//! One streamer at a time: the log admits one reader (PostgreSQL refuses a second session on
//! an active slot; the MySQL source holds a named lock). The others stand by and try again
//! every [`STANDBY_RETRY`]; when the streamer dies, a standby takes over at its next try.

use std::time::Duration;

use tokio::time::Instant;

/// How often a standby tries to take the stream over.
pub const STANDBY_RETRY: Duration = Duration::from_secs(1);

/// When this source may next try to take the stream, and whether it is standing by.
#[derive(Debug)]
pub struct StreamClaim {
    next_attempt: Instant,
    standing_by: bool,
}

impl Default for StreamClaim {
    fn default() -> Self {
        Self {
            next_attempt: Instant::now(),
            standing_by: false,
        }
    }
}

impl StreamClaim {
    /// Whether a try to take the stream is due; if so the next one is [`STANDBY_RETRY`] away.
    pub fn due(&mut self) -> bool {
        let now = Instant::now();
        if now < self.next_attempt {
            return false;
        }
        self.next_attempt = now + STANDBY_RETRY;
        true
    }

    /// Another relay streams. True the first time since this source last streamed: say so
    /// once.
    pub fn stand_by(&mut self) -> bool {
        !std::mem::replace(&mut self.standing_by, true)
    }

    /// This source took the stream; true when it stood by before (it took over).
    pub fn took(&mut self) -> bool {
        std::mem::take(&mut self.standing_by)
    }

    /// The session was lost: the next `fetch` tries again at once.
    pub fn retry_now(&mut self) {
        self.next_attempt = Instant::now();
    }

    /// When the next try is due.
    pub fn next_attempt(&self) -> Instant {
        self.next_attempt
    }
}
