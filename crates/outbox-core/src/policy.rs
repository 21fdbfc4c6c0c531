//! Retry policy: exponential backoff with jitter, and the one place where a failure kind is
//! turned into an action (retry, dead-letter, or release untouched).

use std::time::Duration;

use rand::Rng;
use serde::Deserialize;

use crate::SinkErrorKind;

/// Exponential backoff between failed attempts of one event.
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Backoff {
    /// Delay after the first failure.
    #[serde(with = "humantime_serde")]
    pub initial: Duration,
    /// Upper bound of the delay.
    #[serde(with = "humantime_serde")]
    pub max: Duration,
    /// Growth factor per failure (at least 1).
    pub multiplier: f64,
    /// Fraction of the delay that is randomized (0 = none, 1 = anywhere in `[0, delay]`).
    /// Spreads retries of events that failed together.
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(300),
            multiplier: 2.0,
            jitter: 0.5,
        }
    }
}

impl Backoff {
    /// Checks the values; returns the offending key and why.
    pub fn validate(&self) -> Result<(), (&'static str, &'static str)> {
        if self.initial.is_zero() {
            return Err(("initial", "must be greater than 0"));
        }
        if self.max < self.initial {
            return Err(("max", "must not be less than `initial`"));
        }
        if !(self.multiplier >= 1.0 && self.multiplier.is_finite()) {
            return Err(("multiplier", "must be a number >= 1"));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(("jitter", "must be between 0 and 1"));
        }
        Ok(())
    }

    /// The delay before the next attempt after `failures` failed attempts (1 = first
    /// failure), before jitter.
    pub fn base_delay(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(64) as i32;
        let secs = self.initial.as_secs_f64() * self.multiplier.powi(exp);
        if secs.is_finite() && secs < self.max.as_secs_f64() {
            Duration::from_secs_f64(secs)
        } else {
            self.max
        }
    }

    /// The jittered delay: uniformly in `[base * (1 - jitter), base]`.
    pub fn delay(&self, failures: u32, rng: &mut impl Rng) -> Duration {
        let base = self.base_delay(failures);
        if self.jitter == 0.0 {
            return base;
        }
        let low = base.as_secs_f64() * (1.0 - self.jitter);
        Duration::from_secs_f64(rng.random_range(low..=base.as_secs_f64()))
    }
}

/// What the relay does with an event whose publish failed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FailureAction {
    /// Record a failed attempt; try again after this delay.
    RetryAfter(Duration),
    /// Record a failed attempt and dead-letter the event.
    DeadLetter,
    /// Leave the event untouched (no attempt counted) and pause the relay: the broker is down.
    Release,
}

/// Retry policy: how many failures an event gets and how long it waits between them.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Failed attempts after which an event is dead-lettered.
    pub max_attempts: u32,
    /// Delay between attempts.
    pub backoff: Backoff,
}

impl RetryPolicy {
    /// The single mapping from failure kind to action. `failures_so_far` excludes the
    /// failure being decided.
    pub fn on_failure(
        &self,
        kind: SinkErrorKind,
        failures_so_far: u32,
        rng: &mut impl Rng,
    ) -> FailureAction {
        match kind {
            SinkErrorKind::Unavailable => FailureAction::Release,
            SinkErrorKind::Rejected => FailureAction::DeadLetter,
            SinkErrorKind::Transient => {
                let failures = failures_so_far.saturating_add(1);
                if failures >= self.max_attempts {
                    FailureAction::DeadLetter
                } else {
                    FailureAction::RetryAfter(self.backoff.delay(failures, rng))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 3,
            backoff: Backoff {
                initial: Duration::from_millis(100),
                max: Duration::from_secs(1),
                multiplier: 2.0,
                jitter: 0.0,
            },
        }
    }

    #[test]
    fn backoff_grows_exponentially_then_caps() {
        let b = policy().backoff;
        assert_eq!(b.base_delay(1), Duration::from_millis(100));
        assert_eq!(b.base_delay(2), Duration::from_millis(200));
        assert_eq!(b.base_delay(4), Duration::from_millis(800));
        assert_eq!(b.base_delay(5), Duration::from_secs(1));
        assert_eq!(b.base_delay(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn transient_failures_retry_until_max_attempts_then_dead_letter() {
        let p = policy();
        let mut rng = rand::rng();
        assert_eq!(
            p.on_failure(SinkErrorKind::Transient, 0, &mut rng),
            FailureAction::RetryAfter(Duration::from_millis(100))
        );
        assert_eq!(
            p.on_failure(SinkErrorKind::Transient, 1, &mut rng),
            FailureAction::RetryAfter(Duration::from_millis(200))
        );
        assert_eq!(
            p.on_failure(SinkErrorKind::Transient, 2, &mut rng),
            FailureAction::DeadLetter
        );
    }

    #[test]
    fn rejected_dead_letters_at_once_and_unavailable_never_counts() {
        let p = policy();
        let mut rng = rand::rng();
        assert_eq!(
            p.on_failure(SinkErrorKind::Rejected, 0, &mut rng),
            FailureAction::DeadLetter
        );
        assert_eq!(
            p.on_failure(SinkErrorKind::Unavailable, 99, &mut rng),
            FailureAction::Release
        );
    }

    #[test]
    fn invalid_backoff_names_the_key() {
        let b = Backoff {
            multiplier: 0.5,
            ..Backoff::default()
        };
        assert_eq!(b.validate(), Err(("multiplier", "must be a number >= 1")));
        let b = Backoff {
            max: Duration::from_millis(1),
            ..Backoff::default()
        };
        assert_eq!(b.validate().map_err(|e| e.0), Err("max"));
    }

    proptest! {
        #[test]
        fn jittered_delay_stays_within_bounds(failures in 1u32..40, jitter in 0.0f64..=1.0) {
            let b = Backoff { jitter, ..Backoff::default() };
            let base = b.base_delay(failures);
            let d = b.delay(failures, &mut rand::rng());
            prop_assert!(d <= base);
            prop_assert!(d.as_secs_f64() >= base.as_secs_f64() * (1.0 - jitter) - 1e-9);
        }
    }
}
