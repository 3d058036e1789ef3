import DocumentEngine
import FUSE

/// DocumentFS joins the document engine and the FUSE layer: documents become package
/// directories and their wrappers become files. It is the only module that knows both.
public enum DocumentFS {
    /// The version of DocFS.
    public static let version = "0.1.0"
}
