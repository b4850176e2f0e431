//! Proptest strategies (filled in below).
