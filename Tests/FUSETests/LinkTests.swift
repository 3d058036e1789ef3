import FUSE
import Testing

@Test func linksAgainstLibfuse3() {
    #expect(libfuseVersion >= 314)
}
