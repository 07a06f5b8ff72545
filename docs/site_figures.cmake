# site_figures.cmake: run after Doxygen (-DHTML=<the html folder> -DFIGURES=<docs/figures>).
# The chapter READMEs show their figures as ../../docs/figures/NAME.png, the path that
# works where they are read on disk; Doxygen keeps such a path as it is. This copies the
# figures into the site and points those images at the copies, so the site stands alone.
file(GLOB _figures ${FIGURES}/*.png)
file(COPY ${_figures} DESTINATION ${HTML})
file(GLOB _pages ${HTML}/*.html)
foreach(_page ${_pages})
  file(READ ${_page} _text)
  string(FIND "${_text}" "docs/figures/" _at)
  if(NOT _at EQUAL -1)
    string(REPLACE "src=\"../../docs/figures/" "src=\"" _text "${_text}")
    string(REPLACE "src=\"docs/figures/" "src=\"" _text "${_text}")
    file(WRITE ${_page} "${_text}")
  endif()
endforeach()
