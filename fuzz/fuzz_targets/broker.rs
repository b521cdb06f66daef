//! The embedded broker's packet handling: any bytes a client may send on
//! one connection (a CONNECT or not, of any protocol level, then any
//! packets), read by the real connection code. Nothing may panic or hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tunefleet_broker::serve::fuzz_connection(data);
});
