extension FileWrapper {
    /// The version of the serialized-representation format this program writes and reads.
    public static let serializationVersion: UInt16 = 1
}
