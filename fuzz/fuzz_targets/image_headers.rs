//! Fuzz target: the PNG, GIF, JPEG and SVG size readers over the same
//! bytes, within the image budget (nothing is decoded: memory is at most a
//! copy of the input), and an SVG size is finite when there is one.
#![no_main]

use jail::artifacts::fuzzing::{images, Deadline, Parser};
use jail::result::Summary;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let sizes = jail_fuzz::within_budget(Parser::Image, data.len(), || images(data, Deadline::from_now()));
    for s in sizes.into_iter().flatten() {
        match s {
            Summary::Image { .. } => {}
            Summary::Svg { width, height } => {
                assert!(width.is_none_or(f64::is_finite) && height.is_none_or(f64::is_finite));
            }
            other => panic!("an image summary of another kind: {other:?}"),
        }
    }
});
