import DocumentEngine
import FUSE
import VersionedStore

/// DocumentFS joins the document engine and the FUSE layer: documents become package
/// directories and their wrappers become files. It is the only module that knows both.
///
/// ``DocumentFileSystem`` is the file system; ``DocumentFSMount`` mounts a store with it.
public enum DocumentFS {
    /// The version of DocFS.
    public static let version = "0.1.0"
}
