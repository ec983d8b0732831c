//! Entry points: the SQL functions whose whole job is to check their arguments, call the
//! domain modules and shape the answer. (Most entry points still live beside the domain
//! code they call; docs/architecture.md says where each is.)

mod configure;
mod create_group;
