//! (Being written: the poll steps the SQL database crates share over sqlx.)
