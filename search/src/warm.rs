//! Warm start: results of other studies told to a study's search before
//! its first ask (`[warm_start] studies`), so a study whose range was
//! narrowed or widened goes on from what is known instead of cold. Only
//! the results whose every parameter this study searches, inside its
//! space, are told (a narrowed range drops what now lies outside).

use tunefleet_common::params::Params;

use crate::space::ParamSpec;

/// Trial ids of results told from other studies: far above any trial id
/// a study makes, so they never meet one of its own.
pub const WARM_ID_BASE: u64 = 1 << 62;

/// `params` as a point of `space`: its value of each parameter of `space`,
/// when it has every one and `space` holds each; `None` otherwise.
pub fn in_space(space: &[(String, ParamSpec)], params: &Params) -> Option<Params> {
    space
        .iter()
        .map(|(name, spec)| params.get(name).filter(|v| spec.holds(v)).map(|v| (name.clone(), v.clone())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tunefleet_common::params::ParamValue;

    fn space() -> Vec<(String, ParamSpec)> {
        vec![
            ("lr".into(), ParamSpec::LogFloat { low: 1e-3, high: 1e-1, grid: 0 }),
            ("layers".into(), ParamSpec::Int { low: 2, high: 8, step: 2 }),
            ("opt".into(), ParamSpec::Categorical { values: vec![ParamValue::Text("adam".into())] }),
        ]
    }

    fn point(lr: f64, layers: i64, opt: &str) -> Params {
        [
            ("lr".to_string(), ParamValue::Float(lr)),
            ("layers".to_string(), ParamValue::Int(layers)),
            ("opt".to_string(), ParamValue::Text(opt.into())),
        ]
        .into()
    }

    #[test]
    fn only_points_inside_the_space_are_told() {
        let s = space();
        assert!(in_space(&s, &point(0.01, 4, "adam")).is_some());
        assert!(in_space(&s, &point(0.5, 4, "adam")).is_none(), "outside a narrowed range");
        assert!(in_space(&s, &point(0.01, 3, "adam")).is_none(), "off the int's lattice");
        assert!(in_space(&s, &point(0.01, 4, "sgd")).is_none(), "a category no longer searched");
        assert!(in_space(&s, &point(f64::NAN, 4, "adam")).is_none());
        let mut extra = point(0.01, 4, "adam");
        extra.insert("momentum".into(), ParamValue::Float(0.9));
        assert_eq!(in_space(&s, &extra), Some(point(0.01, 4, "adam")), "parameters no longer searched dropped");
        let mut short = point(0.01, 4, "adam");
        short.remove("opt");
        assert!(in_space(&s, &short).is_none(), "a parameter it lacks");
    }
}
