//! (Being written: the snapshot steps the SQL database crates share over sqlx.)
