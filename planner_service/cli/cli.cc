// Placeholder until the CLI commands land.
namespace arachne {}
