//! (Being written: the backfill steps the SQL database crates share over sqlx.)
