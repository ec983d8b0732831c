//! In-server tests (`cargo pgrx test`): single-session SQL semantics.

use pgrx::prelude::*;

#[pg_schema]
mod tests {
    use pgrx::prelude::*;

    #[pg_test]
    fn push_then_pop() {
        Spi::run("SELECT * FROM queen.push('t1', '{\"a\": 1}')").unwrap();
        let n = Spi::get_one::<i64>("SELECT count(*) FROM queen.pop('t1')").unwrap();
        assert_eq!(n, Some(1));
    }
}
