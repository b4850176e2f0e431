//! The builder-style setters of the option structs.

/// Builder-style setters, one per field: `fn field(self, value) -> Self`.
macro_rules! setters {
    ($ty:ty { $($field:ident: $t:ty),* $(,)? }) => {
        impl $ty {
            $(
                #[doc = concat!("Sets `", stringify!($field), "`.")]
                pub fn $field(mut self, $field: $t) -> Self {
                    self.$field = $field;
                    self
                }
            )*
        }
    };
}
pub(crate) use setters;
