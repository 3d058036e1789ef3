import CFuse3

/// The libfuse version this layer is built against (major * 100 + minor).
public var libfuseVersion: Int { Int(fuse_version()) }
