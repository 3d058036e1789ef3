/// The DocFS document engine: Apple's document model (FileWrapper, Document, undo, archiving)
/// for Swift on Linux. It knows nothing of FUSE.
public enum DocumentEngine {}
