import FUSE
import Testing

#if canImport(Glibc)
    import Glibc
#endif

// Serialized: the check redirects standard error for the whole process.
@Suite(.serialized) struct OptionCheckTests {
    @Test func libfuseJudgesEachOptionWithoutMounting() {
        #expect(MountOptions.libfuseAccepts(option: "max_read=131072"))
        #expect(MountOptions.libfuseAccepts(option: "noatime"))
        #expect(!MountOptions.libfuseAccepts(option: "no_such_option=1"))
        #expect(!MountOptions.libfuseAccepts(option: "bogus"))
    }

    @Test func standardErrorIsGivenBack() {
        var before = stat()
        var after = stat()
        #expect(fstat(STDERR_FILENO, &before) == 0)
        _ = MountOptions.libfuseAccepts(option: "bogus")
        #expect(fstat(STDERR_FILENO, &after) == 0)
        #expect(before.st_dev == after.st_dev && before.st_ino == after.st_ino)
    }
}
